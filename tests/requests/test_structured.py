"""minigpt.requests.structured alone: compiling each kind of constraint, the masks it gives
(checked against Python's own matching of every token's bytes), completion, and the
errors that name the option."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from minigpt.errors import InputError, MinigptError
from minigpt.requests.request import one_constraint
from minigpt.requests.structured import compile_constraint

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")


def token_texts(tokenizer) -> list[bytes]:
    return [tokenizer.decode_single_token_bytes(t) for t in range(tokenizer.n_vocab)]


@pytest.fixture(scope="module")
def vocab(tokenizer):
    return token_texts(tokenizer)


def allowed_ids(matcher) -> set[int]:
    return set(np.flatnonzero(matcher.allowed()).tolist())


def test_a_regex_allows_exactly_the_tokens_that_keep_the_text_a_prefix_of_a_match(tokenizer, vocab):
    """[0-9]{1,3}: first any token of one to three digits; after "12" one more digit or the end;
    after "123" only the end. Python's re decides each token, llguidance must agree on all 50,257."""
    matcher = compile_constraint(tokenizer, "regex", "[0-9]{1,3}").start(())
    eos = tokenizer.eot_token

    def expected(before: bytes) -> set[int]:
        return {t for t, b in enumerate(vocab) if t != eos and b and re.fullmatch(rb"[0-9]{1,3}", before + b)}

    assert allowed_ids(matcher) == expected(b"") and not matcher.complete
    matcher.advance(tokenizer.encode("12")[0])
    assert allowed_ids(matcher) == expected(b"12") | {eos} and not matcher.complete
    matcher.advance(tokenizer.encode("3")[0])
    assert allowed_ids(matcher) == {eos} and matcher.complete


def test_without_the_end_of_text_token_a_grammar_ends_only_complete(tokenizer):
    """eos_allowed False: the end-of-text bit is never set, even where the grammar could end."""
    matcher = compile_constraint(tokenizer, "regex", "[0-9]+", eos_allowed=False).start(())
    matcher.advance(tokenizer.encode("7")[0])
    assert tokenizer.eot_token not in allowed_ids(matcher) and not matcher.complete
    done = compile_constraint(tokenizer, "regex", "7", eos_allowed=False).start(())
    done.advance(tokenizer.encode("7")[0])
    assert allowed_ids(done) == set() and done.complete


def test_the_mask_sets_disallowed_logits_to_minus_infinity_and_keeps_the_others_bitwise(tokenizer):
    matcher = compile_constraint(tokenizer, "choice", ["yes", "no"]).start(())
    logits = np.random.default_rng(0).standard_normal(tokenizer.n_vocab)
    z = logits.copy()
    matcher.apply(z)
    allowed = matcher.allowed()
    assert np.array_equal(z[allowed], logits[allowed]) and np.all(z[~allowed] == -np.inf)
    assert {tokenizer.decode([t]) for t in np.flatnonzero(allowed)} == {"y", "ye", "yes", "n", "no"}


def test_the_masks_follow_the_tokens_taken_whatever_came_before_the_matcher(tokenizer):
    """A matcher's masks depend on the tokens it advanced with only: two matchers of one constraint,
    started after different prompts, give bitwise the same mask at every step of the same text."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    constraint = compile_constraint(tokenizer, "json_schema", schema)
    first, second = constraint.start((1, 2, 3)), constraint.start(())
    for token in tokenizer.encode('{"n": 42}'):
        assert np.array_equal(first.bits(), second.bits()) and first.allowed()[token]
        first.advance(token)
        second.advance(token)
    assert first.complete and second.complete


@pytest.mark.parametrize("kind, value, text", [
    ("json_schema", {"type": "object", "properties": {"name": {"type": "string"}, "tags": {
        "type": "array", "items": {"type": "string"}}}, "required": ["name", "tags"]}, '{"name": "Ada", "tags": ["x"]}'),
    ("json_schema", '{"type": "array", "items": {"type": "integer"}, "maxItems": 2}', "[1, 2]"),
    ("choice", ["héllo wörld", "😀", "a \"quoted\" one"], "😀"),
    ("grammar", 'start: "(" num ("," num)* ")"\nnum: /[0-9]+/', "(1,22,333)"),
    ("grammar", 'root ::= "(" num ("," num)* ")"\nnum ::= [0-9]+', "(1,22,333)"),  # GBNF, llama.cpp's
])
def test_each_kind_compiles_and_its_text_walks_to_completion(tokenizer, kind, value, text):
    """The text's own tokens are each allowed in turn, and then the grammar is complete."""
    matcher = compile_constraint(tokenizer, kind, value).start(())
    for token in tokenizer.encode(text):
        assert matcher.allowed()[token] and not matcher.complete
        matcher.advance(token)
    assert matcher.complete


def test_json_is_laid_out_as_pythons_json_dumps_lays_it_out(tokenizer):
    """", " and ": " and no other whitespace, so that a model cannot pad the text forever; a schema's
    "x-guidance" key can ask for llguidance's free whitespace instead."""
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    for text, whole in [(json.dumps({"a": [1, 2]}), True), ('{"a":[1,2]}', False), ('{ "a": [1, 2]}', False)]:
        matcher = compile_constraint(tokenizer, "json_schema", schema).start(())
        ids = tokenizer.encode(text)
        taken = 0
        while taken < len(ids) and matcher.allowed()[ids[taken]]:
            matcher.advance(ids[taken])
            taken += 1
        assert (taken == len(ids) and matcher.complete) == whole, text
    free = compile_constraint(tokenizer, "json_schema", {**schema, "x-guidance": {"whitespace_flexible": True}})
    after_brace = free.start(())
    after_brace.advance(tokenizer.encode("{")[0])
    assert after_brace.allowed()[tokenizer.encode("\n")[0]]


def test_matchers_from_one_constraint_are_independent(tokenizer):
    constraint = compile_constraint(tokenizer, "choice", ["cat", "dog"])
    first, second = constraint.start(()), constraint.start(())
    first.advance(tokenizer.encode("cat")[0])
    assert first.complete and allowed_ids(second) == allowed_ids(constraint.start(()))


def test_an_empty_regex_is_complete_before_any_token(tokenizer):
    assert compile_constraint(tokenizer, "regex", "").start(()).complete


def test_a_grammar_that_can_never_end_is_never_complete(tokenizer):
    """start: ("a" | "b") start has no finite match: it always allows a next token, never the end."""
    matcher = compile_constraint(tokenizer, "grammar", 'start: ("a" | "b") start').start(())
    for _ in range(50):
        allowed = allowed_ids(matcher)
        assert allowed and tokenizer.eot_token not in allowed and not matcher.complete
        matcher.advance(min(allowed))


@pytest.mark.parametrize("kind, value, says", [
    ("regex", "((", "regex does not compile: invalid regex"),
    ("regex", "a(?=b)", "look-around"),
    ("regex", 12, "regex must be a string, got int"),
    ("json_schema", "{bad", "json_schema is not valid JSON"),
    ("json_schema", "[1, 2]", "json_schema must be a JSON schema"),
    ("json_schema", {"type": "foo"}, "json_schema does not compile: Invalid type: foo"),
    ("json_schema", {"type": "string", "minLength": 5, "maxLength": 2}, "Unsatisfiable schema"),
    ("json_schema", False, "json_schema is false, a schema no JSON is valid under"),
    ("json_schema", {"enum": [float("nan")]}, "json_schema is not JSON"),
    ("json_schema", {"enum": {1, 2}}, "json_schema is not JSON"),
    ("choice", [], "choice must be a non-empty list of strings"),
    ("choice", "yes", "choice must be a non-empty list of strings"),
    ("json_schema", 7, "json_schema must be a JSON schema (an object, or its JSON text), got int"),
    ("choice", ["yes", 1], "choice must be a non-empty list of strings"),
    ("grammar", "start: foo", "grammar does not compile: at 1(8): unknown name"),
    ("grammar", 5, "grammar must be a string, got int"),
    ("grammar", "root ::= (((", "grammar does not compile: Failed to convert the grammar from GBNF"),
])
def test_a_bad_constraint_is_one_line_naming_the_option(tokenizer, kind, value, says):
    with pytest.raises(InputError) as error:
        compile_constraint(tokenizer, kind, value)
    assert says in str(error.value) and "\n" not in str(error.value)


def test_the_error_carries_the_option_so_each_interface_names_it_its_own_way(tokenizer):
    with pytest.raises(InputError) as error:
        compile_constraint(tokenizer, "regex", "((")
    assert error.value.param == "regex"
    assert error.value.message(lambda keyword: f"--{keyword}").startswith("--regex does not compile")
    with pytest.raises(InputError, match="no constraint 'pattern'"):
        compile_constraint(tokenizer, "pattern", "x")


def test_a_model_without_a_tokenizer_has_no_constraints():
    with pytest.raises(InputError, match="regex constrains text: it needs the model's tokenizer"):
        compile_constraint(None, "regex", "x")


def test_without_the_extra_the_error_names_the_extra(tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance raises ImportError
    with pytest.raises(MinigptError, match=r"json_schema needs the structured extra .*pip install 'minigpt\[structured\]'"):
        compile_constraint(tokenizer, "json_schema", json.dumps({"type": "object"}))


def test_a_grammar_beyond_llguidances_limits_is_an_error_naming_the_option_not_a_hang(tokenizer):
    """start: "a" start forces "aaaa..." forever: llguidance gives up after its item limit (at its
    first mask or at the first token), one line naming the option."""
    with pytest.raises(InputError, match=r"^grammar (does not compile|cannot be followed): .*Too many items") \
            as error:
        matcher = compile_constraint(tokenizer, "grammar", 'start: "a" start').start(())
        matcher.advance(int(np.flatnonzero(matcher.allowed())[0]))
    assert "\n" not in str(error.value) and error.value.param == "grammar"


def test_at_most_one_constraint_per_request_the_error_about_the_second(tokenizer):
    with pytest.raises(InputError, match="^regex and choice both constrain the text: give at most one of "
                                         "regex, json_schema, choice, grammar$") as error:
        one_constraint({"regex": "a", "json_schema": None, "choice": ["a"]})
    assert error.value.param == "choice"
    assert one_constraint({"regex": None}) is None and one_constraint({"grammar": "g"}) == ("grammar", "g")
