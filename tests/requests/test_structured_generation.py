"""Structured outputs through the loops and the interfaces: what ends a constrained sequence, the mask
winning over a bias, speculative sampling under a grammar (statistically: the tokens follow the
model's distribution masked by the grammar), and the keywords of the API, the command line's flags
and batch's keys, each giving what `generate` gives alone."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from chi_square import chi_square_rejects
from commands import batch, cli

import minigpt
from minigpt.errors import InputError
from minigpt.engine.speculative import verify
from minigpt.loop.loops import cached_steps
from minigpt.loop.sequence import Sequence
from requesting import new_request

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")


def constrained(model, prompt, n, **options) -> Sequence:
    seq = Sequence(new_request(model, prompt, n, **options))
    for _ in cached_steps(model, seq):
        pass
    return seq


def test_a_complete_grammar_ends_with_stop_a_cut_one_with_length(tiny_model, tokenizer):
    """choice: "stop" on the token that completes a choice; with too few tokens, "length"."""
    whole = constrained(tiny_model, [464], 20, choice=["yes", "no thanks"])
    assert whole.finish_reason == "stop" and whole.result(True).text in ("yes", "no thanks")
    cut = constrained(tiny_model, [464], 1, choice=["yes please", "no thanks"])
    assert cut.finish_reason == "length" and len(cut.tokens) == 1


def test_a_grammar_that_never_completes_is_cut_at_max_new_tokens(tiny_model):
    seq = constrained(tiny_model, [464], 12, grammar='start: ("a" | "b") start')
    assert seq.finish_reason == "length" and len(seq.tokens) == 12 and set(seq.result(True).text) <= {"a", "b"}


def test_a_grammar_the_empty_text_completes_ends_before_any_token(tiny_model):
    seq = constrained(tiny_model, [464], 5, regex="")
    assert seq.finish_reason == "stop" and seq.tokens == []


def test_the_mask_wins_over_a_bias_and_ends_at_eos_only_where_the_grammar_may_end(tiny_model, tokenizer):
    """+100 on <|endoftext|>: forbidden before the first digit of [0-9]+, chosen right after it
    ("eos"); without stop_at_eos never allowed, so the bias changes nothing and the text is cut."""
    eos = tokenizer.eot_token
    ended = constrained(tiny_model, [464], 6, regex="[0-9]+", logit_bias={eos: 100})
    assert ended.finish_reason == "eos" and len(ended.tokens) == 2 and ended.tokens[-1] == eos
    assert re.fullmatch("[0-9]+", ended.result(True).text)
    going = constrained(tiny_model, [464], 6, regex="[0-9]+", logit_bias={eos: 100}, stop_at_eos=False)
    assert eos not in going.tokens and going.finish_reason == "length"


FAILING = 'start: ("b" | "c") rest\nrest: "a" rest'  # after its first token, "aaaa..." forced forever


def test_a_grammar_that_gives_up_mid_way_is_an_error_about_its_own_prompt(tiny_model):
    """llguidance gives up on FAILING at its first token (its item limit): generate raises naming the
    option, and in a batch the error names its prompt."""
    with pytest.raises(InputError, match="^grammar cannot be followed: .*Too many items"):
        minigpt.generate(tiny_model, [464], 5, grammar=FAILING)
    with pytest.raises(InputError) as error:
        minigpt.generate_batch(tiny_model, [[1, 2], [464]], 5, grammar=[None, FAILING])
    assert (error.value.param, error.value.prompt) == ("grammar", 1)


def test_speculative_sampling_under_a_grammar_follows_the_masked_distribution(tiny_model, tokenizer):
    """5,000 verifications of one draft, drawn from a q that favours tokens the grammar forbids: the
    first token follows the first row's distribution renormalised over the allowed tokens (a
    forbidden draft is never kept), by Pearson's test at significance 0.001."""
    rng = np.random.default_rng(0)
    request = new_request(tiny_model, [464], 2, temperature=1.0, regex="[abc][xyz]", stop_at_eos=False)
    logits = rng.standard_normal((2, tiny_model.config.vocab_size)).astype(np.float32) * 3
    allowed = request.processing[-1].start(()).allowed()
    p = np.where(allowed, np.exp(logits[0].astype(np.float64) - logits[0].max()), 0.0)
    p /= p.sum()
    drafts = [tokenizer.encode_single_token(t) for t in (b"a", b"by", b"q", b"z", b"xy")]
    q = np.zeros(tiny_model.config.vocab_size)
    q[drafts] = [0.1, 0.1, 0.3, 0.3, 0.2]
    first = np.zeros(tiny_model.config.vocab_size, int)
    for _ in range(5000):
        seq = Sequence(request)
        seq.rng = rng
        draft = int(rng.choice(q.size, p=q))
        verify(seq, logits, [draft], q[None], 0.0)
        first[seq.tokens[0]] += 1
    assert not chi_square_rejects(first, p)


# --------------------------------------------------------------------------- the interfaces

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["n"], "additionalProperties": False}
CONSTRAINTS = [dict(regex="[0-9]{1,3}"), dict(json_schema=SCHEMA), dict(json_schema=json.dumps(SCHEMA)),
               dict(choice=["yes", "no thanks"]), dict(grammar='start: "(" /[a-c]{1,3}/ ")"')]


@pytest.mark.parametrize("constraint", CONSTRAINTS)
def test_each_keyword_of_generate_stream_and_generate_batch_gives_the_same_text(tiny_model, tokenizer, constraint):
    ids = minigpt.encode(tokenizer, "The answer is")
    alone = minigpt.generate(tiny_model, ids, 12, temperature=0.8, seed=3, **constraint)
    streamed = list(minigpt.stream(tiny_model, ids, 12, temperature=0.8, seed=3, **constraint))
    assert [r.token for r in streamed] == alone.tokens and "".join(r.text for r in streamed) == alone.text
    together = minigpt.generate_batch(tiny_model, [[1, 2, 3], ids], 12, temperature=0.8, seed=3, **constraint)[1]
    assert (together.tokens, together.logprobs, together.finish_reason) == (alone.tokens, alone.logprobs,
                                                                           alone.finish_reason)
    assert alone.finish_reason == "stop"


def test_generate_batch_takes_a_constraint_per_prompt(tiny_model, tokenizer):
    prompts = [[464], [464, 3290], [1, 2]]
    results = minigpt.generate_batch(tiny_model, prompts, 8, choice=[["cat", "dog"], None, ["x y"]])
    assert results[0].text in ("cat", "dog") and results[2].text == "x y"
    assert results[1].tokens == minigpt.generate(tiny_model, prompts[1], 8).tokens


def test_two_constraints_are_one_error_about_the_second(tiny_model):
    with pytest.raises(InputError, match="^regex and grammar both constrain the text") as error:
        minigpt.generate(tiny_model, [464], 4, regex="a", grammar='start: "a"')
    assert error.value.param == "grammar"


def test_the_command_line_takes_each_constraint(capsys, tmp_path, tiny_model, tokenizer):
    """--regex, --json-schema as JSON and as a file, --choice repeated, --grammar from a file: the text
    generate gives; the JSON record holds the constraint."""
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "g.lark").write_text('start: "(" /[a-c]{1,3}/ ")"')
    runs = [(["--regex", "[0-9]{1,3}"], dict(regex="[0-9]{1,3}")),
            (["--json-schema", json.dumps(SCHEMA)], dict(json_schema=SCHEMA)),
            (["--json-schema", str(tmp_path / "schema.json")], dict(json_schema=SCHEMA)),
            (["--choice", "yes", "--choice", "no thanks"], dict(choice=["yes", "no thanks"])),
            (["--grammar", str(tmp_path / "g.lark")], dict(grammar='start: "(" /[a-c]{1,3}/ ")"'))]
    for argv, keywords in runs:
        code, out, err = cli(capsys, "The answer is", "--model", "random-tiny", "--max-new-tokens", "12", "--json",
                             *argv)
        record = json.loads(out)
        alone = minigpt.generate(tiny_model, minigpt.encode(tokenizer, "The answer is"), 12, **keywords)
        assert (code, record["text"], record["finish_reason"]) == (0, alone.text, "stop"), err
        (name, value), = keywords.items()
        assert record[name] == (list(value) if name == "choice" else value)


@pytest.mark.parametrize("argv, says", [
    (["--regex", "(("], "error: argument --regex: does not compile: invalid regex"),
    (["--regex", "a", "--choice", "b"], "error: argument --choice: --regex and --choice both constrain the text"),
    (["--json-schema", "{bad"], "error: argument --json-schema: is not valid JSON"),
    (["--json-schema", "/no/such/schema.json"], "error: cannot read --json-schema '/no/such/schema.json'"),
    (["--grammar", "/no/such/grammar.lark"], "error: cannot read --grammar '/no/such/grammar.lark'"),
])
def test_the_command_line_names_a_bad_constraint_by_its_flag(capsys, argv, says):
    code, out, err = cli(capsys, "hi", "--model", "random-tiny", *argv)
    assert (code, out) == (2, "") and err.startswith(says) and err.count("\n") == 1, err


def test_batch_lines_take_each_constraint_as_a_key(capsys, tmp_path, tiny_model):
    lines = [{"prompt_ids": [464], **c} for c in CONSTRAINTS] + [{"prompt_ids": [464, 3290]}]
    code, results, err = batch(capsys, tmp_path, lines, "random-tiny", "--max-new-tokens", "12")
    assert code == 0, err
    for line, result in zip(lines, results):
        alone = minigpt.generate(tiny_model, line["prompt_ids"], 12, **{k: v for k, v in line.items()
                                                                         if k != "prompt_ids"})
        assert (result["tokens"], result["text"], result["finish_reason"]) == (alone.tokens, alone.text,
                                                                                alone.finish_reason)


def test_a_batch_line_names_a_bad_constraint_by_its_key(capsys, tmp_path):
    code, _, err = batch(capsys, tmp_path, [{"prompt": "a"}, {"prompt": "b", "regex": "(("}], "random-tiny")
    assert code == 2 and f"{tmp_path / 'in.jsonl'} line 2: regex does not compile: invalid regex" in err
