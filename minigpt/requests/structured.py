"""Structured outputs: the new text must match a regex, a JSON schema, one of a few strings, or a Lark
grammar, enforced by masking each step's logits to the tokens that keep it matchable
(docs/logits-processing.md#constrained-decoding).

llguidance (the `structured` extra) compiles a constraint against GPT-2's encoding. A `Constraint`
is a logits processing; its `Matcher`, one per sequence, sets the tokens that cannot extend the text
towards a match to -inf. The mask depends only on the tokens kept, so whatever leaves a sequence's
logits bitwise the same leaves its constrained tokens the same too.
"""

from __future__ import annotations

import json
import re
import threading
import weakref

import numpy as np
import tiktoken

from ..errors import InputError, shown

CONSTRAINTS = ("regex", "json_schema", "choice", "grammar")  # at most one per request
# What a constraint may cost, decided before llguidance's work and never by the clock, so that the
# verdict is the same under any load (docs/logits-processing.md#what-a-constraint-may-cost):
MAX_CONSTRAINT_CHARS = 16_384  # its text: a regex, a grammar, a schema's JSON, the choices as one regex (a
# literal's masks grow as the square of its length: one of 16,000 characters takes a good part of a second)
MAX_REPETITION = 1_000  # a counted repetition's count ({m,n}: n; {m,}: m), nested ones multiplied
# llguidance's own budgets, counted in its work: lexer fuel (regex nodes built) to start and per mask,
# lexer states, Earley items per mask and per row, grammar size. A mask beyond them fails the sequence.
LIMITS = dict(initial_lexer_fuel=200_000, step_lexer_fuel=50_000, max_lexer_states=50_000, step_max_items=20_000,
              max_items_in_row=2_000, max_grammar_size=200_000)
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
    """The check of option `kind`'s value (minigpt.requests.request.OPTIONS), its type only, no
    llguidance: a regex or grammar as a string, a JSON schema as an object or its JSON text (parsed
    here), a choice as a non-empty list of strings (a tuple)."""
    def check(value: object, name: str) -> object:
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


def json_schema(value: object, name: str) -> dict:
    """A JSON schema given as an object (or true: any JSON) or as its JSON text, as an object."""
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
    if value is False:
        raise InputError(f"{{{name}}} is false, a schema no JSON is valid under: no text matches it", name)
    return {} if value is True else value  # true: any JSON, as {} (JSON Schema's meaning)


def compile_constraint(tokenizer: tiktoken.Encoding | None, kind: str, value: object,
                       eos_allowed: bool = True) -> Constraint:
    """Compile `value` as constraint `kind` (one of CONSTRAINTS) for `tokenizer`: an InputError about
    the option when the value is of the wrong type, longer than MAX_CONSTRAINT_CHARS, repeats beyond
    MAX_REPETITION, does not compile or goes beyond llguidance's LIMITS at its first mask.
    eos_allowed False (a sequence that does not stop at <|endoftext|>): the grammar never allows
    the end-of-text token, so the text ends only when it matches whole and cannot grow."""
    if kind not in CONSTRAINTS:
        raise InputError(f"no constraint {shown(kind)}: one of {', '.join(CONSTRAINTS)}")
    value = check_value(kind)(value, kind)
    text = source(kind, value)
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise InputError(f"{{{kind}}} is too long: {{length}} characters{' as one regex' if kind == 'choice' else ''}"
                         f", at most {MAX_CONSTRAINT_CHARS:,}", kind, length=f"{len(text):,}")
    for regex in regexes(kind, value, text):
        check_repetition(regex, kind)
    llg = llguidance(kind)
    if tokenizer is None:
        raise InputError(f"{{{kind}}} constrains text: it needs the model's tokenizer (GPT-2's vocabulary), "
                         "and this model has none", kind)
    ll = ll_tokenizer(tokenizer, kind)
    matcher = llg.LLMatcher(ll, grammar_of(llg, kind, value, text), log_level=0,
                            limits=llg.LLParserLimits(verbose_errors=False, **LIMITS))  # errors without its state
    first = np.zeros(((ll.vocab_size + 31) // 32,), np.uint32)  # the first mask: beyond the limits fails here
    if not matcher.is_error():
        matcher.unsafe_compute_mask_ptr(first.ctypes.data, first.nbytes)
    if matcher.is_error():
        raise InputError(f"{{{kind}}} does not compile: {{error}}", kind, error=message(matcher.get_error(), kind))
    return Constraint(kind, matcher, first, ll.vocab_size, tokenizer.eot_token, eos_allowed)


LITERAL = {ord(c): "\\" + c for c in "\\.+*?()|[]{}^$#&-~"}  # a regex's special characters, escaped


def source(kind: str, value: object) -> str:
    """A checked constraint's text, as llguidance reads it: a choice is one regex of its strings."""
    if kind == "choice":
        return "|".join(choice.translate(LITERAL) for choice in value)
    return json.dumps(value) if kind == "json_schema" else value


def regexes(kind: str, value: object, text: str) -> list[str]:
    """The regexes whose counted repetitions a constraint repeats: a regex or grammar itself (a
    Lark grammar counts its rules' repetitions, x{3} or x~3, as a regex does), a schema's patterns."""
    if kind in ("regex", "grammar"):
        return [text]
    if kind == "json_schema":
        found: list[str] = []
        walk = [value]
        while walk:
            node = walk.pop()
            if isinstance(node, dict):
                found += [node["pattern"]] if isinstance(node.get("pattern"), str) else []
                found += list(node["patternProperties"]) if isinstance(node.get("patternProperties"), dict) else []
                walk += node.values()
            elif isinstance(node, list):
                walk += node
        return found
    return []  # a choice's regex repeats nothing


# a regex's pieces: an escape, a class, a group's ends, a counted repetition ({m}, {m,}, {m,n}, Lark's ~m..n)
PIECES = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]|[()]|\{(\d+)(?:,(\d*))?\}|~\s*(\d+)(?:\s*\.\.\s*(\d+))?|.", re.S)


def check_repetition(regex: str, kind: str) -> None:
    """An InputError when a counted repetition in `regex` repeats anything more than MAX_REPETITION
    times, nested ones multiplied: llguidance's lexer builds a state per repetition ((a{1000}){1000}
    takes minutes), known from the text before any work."""
    groups, last = [1], 1  # the most any piece inside each open group repeats; the last piece's count
    for piece in PIECES.finditer(regex):
        counts = [c for c in piece.groups() if c]
        if piece.group() == "(":
            groups.append(1)
            last = 1
        elif piece.group() == ")":
            last = groups.pop() if len(groups) > 1 else 1
            groups[-1] = max(groups[-1], last)
        elif counts:
            count = counts[-1]
            last = min(last * int(count[:31]), 10**30)  # beyond 10^30 (or 31 digits): more than enough
            groups[-1] = max(groups[-1], last)
            if last > MAX_REPETITION:
                raise InputError(f"{{{kind}}} repeats too much: {{piece}} at character {piece.start() + 1} repeats "
                                 f"{{count}} times in all, at most {MAX_REPETITION:,} (a counted repetition builds a "
                                 "lexer state per time)", kind, piece=piece.group(),
                                 count=f"{last:,}" if last < 10**30 else "more than 10^30")
        else:
            last = 1


# JSON laid out as Python's json.dumps lays it out, no other whitespace: a model free to add any
# whitespace (JSON's grammar allows it) can add it forever. A schema's "x-guidance" key overrides it.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_of(llg, kind: str, value: object, text: str) -> str:
    """llguidance's grammar for a checked constraint and its text (`source`)."""
    try:
        if kind == "json_schema":
            return llg.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        if kind in ("regex", "choice"):  # a choice as one regex: one lexeme, as a regex alternation is
            return llg.LLMatcher.grammar_from_regex(text)
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
    checked against the tokenizer, and a matcher at its start, with its first mask, that each sequence copies."""

    def __init__(self, kind: str, start, first: np.ndarray, vocab: int, eos: int, eos_allowed: bool):
        self.kind, self._start, self.vocab, self.eos, self.eos_allowed = kind, start, vocab, eos, eos_allowed
        self.first = self.without_eos(first)
        self.empty = not self.without_eos(first.copy(), always=True).any()  # the empty text matches whole

    def start(self, prompt: tuple[int, ...]) -> Matcher:
        """A new sequence's matcher, at the grammar's start (the prompt is not part of the text to match)."""
        return Matcher(self, self._start.deep_copy())

    def without_eos(self, bits: np.ndarray, always: bool = False) -> np.ndarray:
        """A mask [words] with the end-of-text token's bit cleared (when eos is not allowed, or always)."""
        if always or not self.eos_allowed:
            word, bit = divmod(self.eos, 32)
            bits[word] &= ~np.uint32(1 << bit)
        return bits


class Matcher:
    """One sequence's place in its grammar, a logits processor: the mask of the tokens allowed next
    (computed once per place, by `prepare`: the engine does it on its mask thread, so that a costly
    mask holds up its own sequence only), applied to a row, advanced with each token the sequence keeps."""

    def __init__(self, constraint: Constraint, matcher):
        self.constraint, self._matcher = constraint, matcher
        self._bits: np.ndarray | None = constraint.first  # uint32 [ceil(vocab / 32)]: bit t % 32 of word t // 32
        self._moved = False  # it has advanced: its first mask (the constraint's, shared) is behind it

    @property
    def ready(self) -> bool:
        """The mask at this place is computed: `apply` costs microseconds."""
        return self._bits is not None

    def prepare(self) -> None:
        """Compute the mask at this place (llguidance works without the GIL); an InputError when
        llguidance gives up (a step beyond its LIMITS)."""
        self.bits()

    def bits(self) -> np.ndarray:
        """The mask at this place, uint32 [ceil(vocab / 32)], the bit of each allowed token set."""
        if self._bits is None:
            bits = np.zeros(((self.constraint.vocab + 31) // 32,), np.uint32)
            self._matcher.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
            self._check()
            self._bits = self.constraint.without_eos(bits)
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
        self._bits, self._moved = None, True

    @property
    def complete(self) -> bool:
        """Nothing can follow but the end: the text matches the grammar and cannot grow (llguidance
        knows it from the parser's state once it has advanced, without a mask)."""
        return self._matcher.is_stopped() if self._moved else self.constraint.empty

    def _check(self) -> None:
        """llguidance's matcher never raises: a token outside the grammar, or a step beyond its limits
        (a grammar too complex), leaves it in an error state, raised here."""
        if self._matcher.is_error():
            kind = self.constraint.kind
            raise InputError(f"{{{kind}}} cannot be followed: {{error}}", kind,
                             error=message(self._matcher.get_error(), ""))
