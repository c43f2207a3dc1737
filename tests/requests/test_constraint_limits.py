"""What a constraint may cost: limits known from its text (its length, its counted repetitions)
refused before llguidance's work, the same for every form; llguidance's own budgets for the rest;
`choice` as one regex (as many strings as the regex form takes); a schema of `true` as any JSON;
and the engine's mask thread, on which a costly mask holds up its own sequence only."""

from __future__ import annotations

import re

import numpy as np
import pytest
from serving import post
from serving import model, served  # noqa: F401 (fixtures)

import minigpt
from minigpt.engine.engine import Engine
from minigpt.errors import InputError
from minigpt.requests.request import make_requests
from minigpt.requests import structured
from minigpt.requests.structured import MAX_CONSTRAINT_CHARS, MAX_REPETITION, compile_constraint

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")


@pytest.fixture
def no_llguidance(monkeypatch):
    """llguidance made unreachable: a refusal under it was decided before any of its work."""
    def unreachable(kind):
        raise AssertionError("llguidance was called")
    monkeypatch.setattr(structured, "llguidance", unreachable)


def refused(tokenizer, kind: str, value) -> InputError:
    with pytest.raises(InputError) as error:
        compile_constraint(tokenizer, kind, value)
    return error.value


@pytest.mark.parametrize("kind, value, piece, count", [
    ("regex", "a{40000}", "{40000}", "40,000"),
    ("regex", "(a{1000}){1000}", "{1000}", "1,000,000"),  # each alone within the limit, nested beyond it
    ("regex", "x((ab){50}c){30}", "{30}", "1,500"),
    ("regex", "a{1001,}", "{1001,}", "1,001"),
    ("regex", "a{0,99999999999999999999999999999999999}", "{0,99999999999999999999999999999999999}",
     "more than 10^30"),
    ("grammar", 'start: x{3000}\nx: "a"', "{3000}", "3,000"),
    ("grammar", 'start: x ~ 2..5000\nx: "a"', "~ 2..5000", "5,000"),
    ("json_schema", {"type": "string", "pattern": "^(ab){5000}$"}, "{5000}", "5,000"),
    ("json_schema", {"type": "object", "patternProperties": {"^k{2000}$": {}}}, "{2000}", "2,000"),
])
def test_a_counted_repetition_beyond_the_limit_is_refused_from_its_text_before_any_work(tokenizer, no_llguidance,
                                                                                     kind, value, piece, count):
    """Counted repetitions cost llguidance's lexer a state per time: (a{1000}){1000} took minutes and
    a{40000} seconds. Their count is known from the text: refused at once, naming the option and the piece."""
    error = refused(tokenizer, kind, value)
    assert error.param == kind and "\n" not in str(error)
    assert str(error).startswith(f"{kind} repeats too much: {piece} at character ")
    assert f"repeats {count} times in all, at most {MAX_REPETITION:,}" in str(error)


@pytest.mark.parametrize("kind, value", [
    ("regex", "a{1000}"), ("regex", "((a{10}){10}){10}"), ("regex", r"\d{4}-\d{2}-\d{2}( \d{2}:\d{2}){0,1}"),
    ("regex", r"[{]{3}\{5000\}"),  # braces in a class or escaped are characters, not a repetition
    ("choice", ["a{5000}", "(x){99999}"]),  # a choice's strings are literal text
    ("grammar", 'start: x{1000}\nx: "a"'), ("json_schema", {"type": "string", "pattern": "^[a-z]{1,1000}$"}),
])
def test_a_counted_repetition_within_the_limit_compiles(tokenizer, kind, value):
    compile_constraint(tokenizer, kind, value)


def test_one_limit_on_a_constraints_text_for_every_form(tokenizer, no_llguidance):
    """MAX_CONSTRAINT_CHARS for a regex, a grammar, a schema's JSON and the choices as one regex:
    100,000 choices are refused at once, naming the option, with no panic or backtrace text."""
    words = [f"w{i}" for i in range(100_000)]
    alternation = "|".join(words)
    for kind, value in [("choice", words), ("regex", alternation), ("grammar", f"start: /{alternation}/"),
                        ("json_schema", {"enum": words})]:
        error = refused(tokenizer, kind, value)
        assert error.param == kind and str(error).startswith(f"{kind} is too long: ")
        assert f"at most {MAX_CONSTRAINT_CHARS:,}" in str(error)
        assert not re.search("panic|backtrace|RUST_BACKTRACE|stack", str(error), re.I)


def walk_alike(tokenizer, first, second, text: str):
    """Walk the text's tokens through a matcher of each constraint: each token allowed, the masks
    bitwise equal at every place. The first's matcher, at the end."""
    a, b = first.start(()), second.start(())
    for token in tokenizer.encode(text):
        assert np.array_equal(a.bits(), b.bits()) and a.allowed()[token]
        a.advance(token)
        b.advance(token)
    return a


def test_choice_takes_as_many_strings_as_the_same_regex_alternation(tokenizer):
    """2,000 choices (the Lark form failed at the first token): one regex, so each choice's text
    walks to completion and every mask equals the regex alternation's."""
    words = [f"c{i}" for i in range(2000)]
    choice = compile_constraint(tokenizer, "choice", words)
    regex = compile_constraint(tokenizer, "regex", "|".join(words))
    for word in ("c0", "c1999", "c734"):
        assert walk_alike(tokenizer, choice, regex, word).complete


@pytest.mark.parametrize("word", ["a/b", "x{3}", "(", "\\", "[-]", "a|b", "#~&", "^$.*+?", "tab\tnew\nline", "é😀"])
def test_a_choice_is_its_strings_as_literal_text_whatever_regex_characters_they_hold(tokenizer, word):
    constraint = compile_constraint(tokenizer, "choice", [word, "other"])
    matcher = constraint.start(())
    for token in tokenizer.encode(word):
        assert matcher.allowed()[token]
        matcher.advance(token)
    assert matcher.complete


def test_a_schema_of_true_is_any_json_and_false_matches_nothing(tokenizer):
    """JSON Schema's `true` (and vLLM's guided_json: true) is any JSON value, as {} is; `false` is
    refused, naming the option: no text is valid under it."""
    anything, empty = compile_constraint(tokenizer, "json_schema", True), compile_constraint(tokenizer, "json_schema", {})
    for text in ('[1, "a", null]', '{"k": {"n": 2.5}}', "true"):
        walk_alike(tokenizer, anything, empty, text)
    assert compile_constraint(tokenizer, "json_schema", "true").start(()).allowed().sum() > 1
    error = refused(tokenizer, "json_schema", False)
    assert str(error) == "json_schema is false, a schema no JSON is valid under: no text matches it"


def test_the_verdict_is_the_same_under_load(tokenizer):
    """A constraint whose masks are slow (a 16,000-character literal) but within every limit is
    accepted alone and when eight compile at once: nothing about it is decided by the clock."""
    from concurrent.futures import ThreadPoolExecutor

    literal = "ab" * 8_000
    compile_constraint(tokenizer, "regex", literal)
    with ThreadPoolExecutor(8) as pool:
        for constraint in pool.map(lambda _: compile_constraint(tokenizer, "regex", literal), range(8)):
            assert constraint.kind == "regex"


def test_a_matchers_mask_is_prepared_apart_from_the_step(tokenizer):
    """A new matcher has its constraint's first mask ready; after a token its next mask is not,
    until prepare() computes it (the engine's mask thread does); completion needs no mask."""
    matcher = compile_constraint(tokenizer, "regex", "[0-9]{2}").start(())
    assert matcher.ready and not matcher.complete
    matcher.advance(tokenizer.encode("4")[0])
    assert not matcher.ready and not matcher.complete
    matcher.prepare()
    assert matcher.ready and matcher.allowed()[tokenizer.encode("2")[0]]
    matcher.advance(tokenizer.encode("2")[0])
    assert matcher.complete and not matcher.ready


def test_a_slow_constraint_holds_up_its_own_sequence_only(tiny_model):
    """One Engine, a plain request beside a constrained one whose every mask takes a while (a long
    literal): the plain one makes a token at every step until its end, never waiting for a mask,
    while the constrained one sits out the steps its mask is not ready for; both give what they give alone."""
    literal = "ab" * 8_000
    plain = make_requests(tiny_model, [[464, 3290]], {"max_new_tokens": 24, "temperature": 0, "stop_at_eos": False})
    slow = make_requests(tiny_model, [[464]], {"max_new_tokens": 6, "temperature": 0, "regex": literal})
    engine = Engine(tiny_model, max_batch_size=4)
    jobs = engine.jobs_for([plain[0], slow[0]])
    engine.submit(jobs)
    made = []  # after each step: (the plain one's tokens, the constrained one's)
    while engine.pending():
        engine.step()
        made.append((len(jobs[0].seq.tokens), len(jobs[1].seq.tokens)))
    assert [p for p, _ in made[:24]] == list(range(1, 25))
    assert any(s == before < 6 for (_, before), (_, s) in zip(made, made[1:]))  # a step without it
    alone = [minigpt.generate(tiny_model, [464, 3290], 24, temperature=0, stop_at_eos=False),
             minigpt.generate(tiny_model, [464], 6, temperature=0, regex=literal)]
    assert [job.result().tokens for job in jobs] == [r.tokens for r in alone]
    assert literal.startswith(tiny_model.tokenizer.decode(jobs[1].result().tokens))


@pytest.mark.parametrize("extra", [{"guided_json": True}, {"structured_outputs": {"json": True}},
                                   {"response_format": {"type": "json_schema", "json_schema": {"name": "any",
                                                                                                "schema": True}}}])
def test_the_servers_schema_of_true_is_any_json(served, tokenizer, extra):
    """vLLM's guided_json: true and a response_format schema of true: the text generate gives with {}."""
    body = {"model": "random-tiny", "prompt": "The answer is", "max_tokens": 6, "temperature": 0, **extra}
    status, _, answer = post(served[1], "/v1/completions", body)
    alone = minigpt.generate(served[0].model, minigpt.encode(tokenizer, "The answer is"), 6, temperature=0,
                             json_schema={})
    assert status == 200 and answer["choices"][0]["text"] == alone.text, answer


def test_100000_choices_are_a_400_naming_the_field_without_panic_text(served):
    body = {"model": "random-tiny", "prompt": "a", "max_tokens": 2, "guided_choice": [f"w{i}" for i in range(100_000)]}
    status, _, answer = post(served[1], "/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == "guided_choice", answer
    assert answer["error"]["message"].startswith("guided_choice is too long: 688,889 characters as one regex")
    assert not re.search("panic|backtrace", answer["error"]["message"], re.I)
