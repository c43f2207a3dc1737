"""Structured outputs: the new text must match a regex, a JSON schema, one of a few strings, or a Lark
grammar, enforced by masking each step's logits to the tokens that keep it matchable
(docs/logits-processing.md#constrained-decoding).

llguidance (the `structured` extra) compiles a constraint against GPT-2's tiktoken encoding and, at
each step, computes the bitmask of the tokens whose bytes can extend the text so far towards a match:
one bit per token id, 1,571 words of 32 bits for GPT-2's 50,257 tokens. A `Constraint` is a logits
processing (minigpt.loop.processing); its `Matcher`, one per sequence, holds the sequence's place in
the grammar: it masks a row of logits (forbidden tokens to -inf, so no sampler can choose them),
advances with each token kept, and says when the text matches whole and nothing may follow.

The mask depends only on the tokens a sequence has kept, never on how its logits were computed, so
whatever leaves a sequence's logits bitwise the same (batching, the prefix cache, preemption,
speculation) leaves its constrained tokens the same too.
"""

from __future__ import annotations

import json
import re
import threading
import time
import weakref

import numpy as np
import tiktoken

from ..errors import InputError, shown

CONSTRAINTS = ("regex", "json_schema", "choice", "grammar")  # at most one per request
# A mask is computed for every token of every constrained sequence, in the engine's step: a grammar
# whose first one takes longer (llguidance's lexer grows with counted repetitions: a{40000}) is refused.
MAX_MASK_SECONDS = 0.25
_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tiktoken encoding -> llguidance's
_LOCK = threading.Lock()


def llguidance(kind: str):
    """The llguidance module, or one error naming the option that needs it and the extra that brings it."""
    try:
        import llguidance
        import llguidance.tiktoken  # noqa: F401 (the submodule that reads tiktoken's tables)
    except ImportError:
        raise InputError(f"{{{kind}}} needs the structured extra (llguidance is not installed): "
                         "pip install 'minigpt[structured]'", kind) from None
    return llguidance


def ll_tokenizer(tokenizer: tiktoken.Encoding, kind: str):
    """llguidance's view of the encoding (its token trie: a fraction of a second to build), once per encoding."""
    llg = llguidance(kind)
    with _LOCK:
        if tokenizer not in _TOKENIZERS:
            _TOKENIZERS[tokenizer] = llg.tiktoken.lltokenizer_from_encoding(tokenizer)
        return _TOKENIZERS[tokenizer]


# ------------------------------------------------------------------------- checking, compiling


def check_value(kind: str):
    """The check of option `kind`'s value (minigpt.loading.options), its type only, no llguidance:
    None, or a regex or grammar as a string, a JSON schema as an object or its JSON text (parsed
    here), a choice as a non-empty list of strings (a tuple)."""
    def check(value: object, name: str) -> object:
        if value is None:
            return None
        if kind == "json_schema":
            return json_schema(value, name)
        if kind == "choice":
            if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
                raise InputError(f"{{{name}}} must be a non-empty list of strings, got {{value}}", name,
                                 value=shown(value))
            return tuple(value)
        if not isinstance(value, str):
            raise InputError(f"{{{name}}} must be a string, got {{value}}", name, value=type(value).__name__)
        return value
    return check


def json_schema(value: object, name: str) -> dict | bool:
    """A JSON schema given as an object (or true/false) or as its JSON text, as an object."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as e:
            raise InputError(f"{{{name}}} is not valid JSON: {{error}}", name, error=e) from None
    if not isinstance(value, (dict, bool)):
        raise InputError(f"{{{name}}} must be a JSON schema (an object, or its JSON text), got {{value}}", name,
                         value=type(value).__name__)
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:  # a set, NaN, a cycle: not JSON
        raise InputError(f"{{{name}}} is not JSON: {{error}}", name, error=e) from None
    return value


def one_constraint(values: dict) -> tuple[str, object] | None:
    """(kind, value) of the one constraint among checked options (keyword -> value), or None; an
    InputError about the second when two are given."""
    given = [kind for kind in CONSTRAINTS if values.get(kind) is not None]
    if len(given) > 1:
        raise InputError(f"{{{given[0]}}} and {{{given[1]}}} both constrain the text: give at most one of "
                         + ", ".join(f"{{{kind}}}" for kind in CONSTRAINTS), given[1])
    return (given[0], values[given[0]]) if given else None


def compile_constraint(tokenizer: tiktoken.Encoding | None, kind: str, value: object,
                       eos_allowed: bool = True) -> Constraint:
    """Compile `value` as constraint `kind` (one of CONSTRAINTS) for `tokenizer`: an InputError about
    the option when the value is of the wrong type, does not compile, or would cost too much to
    follow. eos_allowed False (a sequence that does not stop at <|endoftext|>): the grammar never
    allows the end-of-text token, so the text ends only when it matches whole and cannot grow."""
    if kind not in CONSTRAINTS:
        raise InputError(f"no constraint {shown(kind)}: one of {', '.join(CONSTRAINTS)}")
    value = check_value(kind)(value, kind)
    llg = llguidance(kind)
    if tokenizer is None:
        raise InputError(f"{{{kind}}} constrains text: it needs the model's tokenizer (GPT-2's vocabulary), "
                         "and this model has none", kind)
    ll = ll_tokenizer(tokenizer, kind)
    matcher = llg.LLMatcher(ll, grammar_of(llg, kind, value), log_level=0,
                            limits=llg.LLParserLimits(verbose_errors=False))  # errors without llguidance's state
    clock = time.perf_counter()
    if not matcher.is_error():
        matcher.compute_bitmask()  # the first mask: a lexer beyond llguidance's limits fails here, not mid-way
    if matcher.is_error():
        raise InputError(f"{{{kind}}} does not compile: {{error}}", kind, error=message(matcher.get_error(), kind))
    if (seconds := time.perf_counter() - clock) > MAX_MASK_SECONDS:
        raise InputError(f"{{{kind}}} is too costly to follow: its first mask took {{seconds}} s, and one is "
                         f"computed for every token (at most {MAX_MASK_SECONDS} s); a counted repetition such as "
                         "a{{40000}} builds that many states", kind, seconds=f"{seconds:.2f}")
    return Constraint(kind, matcher, ll.vocab_size, tokenizer.eot_token, eos_allowed)


# JSON laid out as Python's json.dumps lays it out, no other whitespace: a model free to add any
# whitespace (JSON's grammar allows it) can add it forever. A schema's "x-guidance" key overrides it.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_of(llg, kind: str, value: object) -> str:
    """llguidance's grammar for a checked constraint."""
    try:
        if kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(json.dumps(value), defaults=JSON_LAYOUT)
        if kind == "choice":  # a JSON string is a Lark string literal
            return llg.LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, value)))
        if kind == "regex":
            return llg.LLMatcher.grammar_from_regex(value)
        return llg.grammar_from("grammar", value)  # Lark (with a start rule), or llama.cpp's GBNF, as vLLM takes it
    except ValueError as e:
        raise InputError(f"{{{kind}}} does not compile: {{error}}", kind, error=e) from None


def message(error: str, kind: str) -> str:
    """llguidance's error on one line, without its excerpts of the grammar it wrapped the value in."""
    lines = [line.strip() for line in error.replace("<non-verbose/>", "").splitlines()
             if line.strip() and not re.fullmatch(r"\s*\^+\s*|\s*\d+ \|.*", line)]
    text = " ".join(lines)
    return text if kind == "grammar" else re.sub(r"^at \d+\(\d+\): ", "", text)  # a position in llguidance's wrapper


# ----------------------------------------------------------------------- following, per sequence


class Constraint:
    """One compiled constraint, a logits processing (minigpt.loop.processing): llguidance's grammar
    checked against the tokenizer, and a matcher at its start that each sequence copies."""

    def __init__(self, kind: str, start, vocab: int, eos: int, eos_allowed: bool):
        self.kind, self._start, self.vocab, self.eos, self.eos_allowed = kind, start, vocab, eos, eos_allowed

    def start(self, prompt: tuple[int, ...]) -> Matcher:
        """A new sequence's matcher, at the grammar's start (the prompt is not part of the text to match)."""
        return Matcher(self, self._start.deep_copy())


class Matcher:
    """One sequence's place in its grammar, a logits processor: the mask of the tokens allowed next
    (computed once per place), applied to a row, advanced with each token the sequence keeps."""

    def __init__(self, constraint: Constraint, matcher):
        self.constraint, self._matcher = constraint, matcher
        self._bits: np.ndarray | None = None  # uint32 [ceil(vocab / 32)]: bit t % 32 of word t // 32 is token t
        self._open = True  # a token other than the end-of-text one is allowed

    def bits(self) -> np.ndarray:
        """The mask at this place, uint32 [ceil(vocab / 32)], the bit of each allowed token set."""
        if self._bits is None:
            bits = np.zeros(((self.constraint.vocab + 31) // 32,), np.uint32)
            self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            self._check()
            word, eos = divmod(self.constraint.eos, 32)
            with_eos = bits[word]
            bits[word] &= ~np.uint32(1 << eos)
            self._open = bool(bits.any())
            if self.constraint.eos_allowed:
                bits[word] = with_eos
            self._bits = bits
        return self._bits

    def allowed(self) -> np.ndarray:
        """bool [vocab]: the tokens the grammar allows next."""
        words = self.bits().astype("<u4", copy=False).view(np.uint8)  # little-endian: token t is byte t // 8, bit t % 8
        return np.unpackbits(words, count=self.constraint.vocab, bitorder="little").view(bool)

    def apply(self, z: np.ndarray) -> None:
        """Every token the grammar does not allow next to -inf in z [vocab], in place."""
        np.putmask(z, ~self.allowed(), -np.inf)

    def advance(self, token: int) -> None:
        """The sequence kept `token`, one the mask allowed."""
        self._matcher.consume_token(token)
        self._check()
        self._bits = None

    @property
    def complete(self) -> bool:
        """Nothing can follow but the end: the text matches the grammar and cannot grow."""
        self.bits()
        return not self._open

    def _check(self) -> None:
        """llguidance's matcher never raises: a token outside the grammar, or a step beyond its limits
        (a grammar too complex), leaves it in an error state, raised here."""
        if self._matcher.is_error():
            kind = self.constraint.kind
            raise InputError(f"{{{kind}}} cannot be followed: {{error}}", kind,
                             error=message(self._matcher.get_error(), ""))
