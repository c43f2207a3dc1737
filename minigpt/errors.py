"""One exception hierarchy for every mistake a user can make and every fault minigpt detects
(anything else escaping is a bug in minigpt, not a user's mistake), and the checks of plain values
every public boundary makes: integers, booleans, numbers, token ids, JSON objects without a key twice."""

import math
import numbers
import reprlib
from typing import Callable

import numpy as np


class MinigptError(Exception):
    """Base class: the message names the problem and, where it can, what to do.

    `param` is the argument's keyword ("top_k"), as in OpenAI's error objects; the message is then a
    template, "{top_k} must be an integer >= 1, got {value}", that each interface fills with its own
    names through `message(name)` (docs/loading.md). `prompt` is the index of the prompt at fault.
    """

    def __init__(self, message: str, param: str | None = None, *, prompt: int | None = None, **values: object):
        super().__init__(message)
        self.param, self.prompt, self.values = param, prompt, values

    def message(self, name: Callable[[str], str] = str, subject: bool = True) -> str:
        """The message, each argument named name(keyword); subject=False leaves out the leading one
        (for argparse's "argument --top-k: ...")."""
        if self.param is None:
            return self.args[0]
        lead = "{" + self.param + "} "
        template = self.args[0] if subject else self.args[0].removeprefix(lead)
        return template.format_map(TemplateFields(name, self.values))

    def __str__(self) -> str:
        return self.message() if self.prompt is None else f"prompt {self.prompt}: {self.message()}"


class TemplateFields(dict):
    """A template's fields: its values as given, any other field the name of that argument."""

    def __init__(self, name: Callable[[str], str], values: dict):
        super().__init__(values)
        self.name = name

    def __missing__(self, keyword: str) -> str:
        return self.name(keyword)


class ModelNotFoundError(MinigptError):
    """A model source that is neither a directory, a known alias, nor a reachable hub id."""


class OfflineError(MinigptError):
    """A hub checkpoint was asked for, is not cached, and the hub cannot be reached."""


class CheckpointError(MinigptError):
    """A checkpoint directory or weights file that cannot be loaded as GPT-2."""


class UnsafeCheckpointError(CheckpointError):
    """A weights format that can run code when loaded (pickle); refused, never opened."""


class ConfigError(CheckpointError):
    """A config.json field that is missing, of the wrong type, or inconsistent."""


class TokenizerError(MinigptError):
    """The GPT-2 BPE tables could not be found or read."""


class InputError(MinigptError):
    """Bad arguments: token ids, sampling options, lengths."""


class ContextLengthError(InputError):
    """Prompt plus new tokens do not fit in the model's n_positions."""


class DrafterError(InputError):
    """A speculative drafter (`speculate=` an object of one's own) returned what its contract forbids."""


class EngineBusyError(MinigptError):
    """An Engine driven from a second thread, or from inside one of its own calls (an on_tokens, or the
    loop over its results): one engine is driven from one thread at a time."""


class NumericalError(MinigptError):
    """The forward's activations stopped being finite: finite weights too large for float32 overflowed.
    In a batch, `prompt` is the index of the prompt whose logits did."""


def shown(value: object) -> str:
    """`value` as a message shows it: its repr abridged (reprlib), an integer too long for repr by
    its number of digits."""
    try:
        return reprlib.repr(value)
    except ValueError:
        if isinstance(value, numbers.Integral):
            return f"an integer of about {int(abs(int(value)).bit_length() * math.log10(2)):,} digits"
        return f"a {type(value).__name__} holding an integer too long to print"


def is_int(value: object) -> bool:
    """An integer, Python's or NumPy's, and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(value: object, name: str, minimum: int, maximum: int | None = None) -> int:
    """`value` as an int if it is an integer in minimum..maximum; else InputError about `name`."""
    if not is_int(value) or value < minimum or maximum is not None and value > maximum:
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise InputError(f"{{{name}}} must be an integer {bound}, got {{value}}", name, value=shown(value))
    return int(value)


def check_bool(value: object, name: str) -> bool:
    """`value` if it is True or False (Python or NumPy); else InputError: a string such as "no" would be true."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{{{name}}} must be True or False, got {{value}}", name, value=shown(value))
    return bool(value)


def as_float(value: object) -> float:
    """`value` as the float NumPy computes with, if it is a Python or NumPy int or float (not a bool)
    that a float64 holds; else NaN, which fails every range check. Other numbers (Fraction, Decimal)
    would pass a comparison and then fail inside NumPy, and so would an int beyond float64 (10**400)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Integral, float, np.floating)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.nan


def check_ids(ids, vocab_size: int, name: str = "ids") -> np.ndarray:
    """Token ids as a 1-D int64 array, or InputError about `name` naming the first offending id:
    floats (even 2.0), bools and strings are refused, never cast."""
    if isinstance(ids, (str, bytes)):
        raise InputError("token ids must be integers, got the text {value}; encode it first (minigpt.encode)", name,
                         value=reprlib.repr(ids))
    arr = np.array(ids, dtype=object)  # element by element, whatever the sequence holds
    if arr.ndim != 1:
        raise InputError("token ids must be a 1-D sequence, got {kind} of shape {shape}", name,
                         kind=type(ids).__name__, shape=arr.shape)
    for i, t in enumerate(arr.tolist()):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise InputError("token id at index {index} is {value}, not an integer", name, index=i, value=shown(t))
        if not 0 <= t < vocab_size:
            raise InputError("token id {value} at index {index} is outside [0, {vocab_size})", name, value=shown(t),
                             index=i, vocab_size=vocab_size)
    return arr.astype(np.int64)


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.loads' object_pairs_hook: a key given twice is ambiguous, so a ValueError naming it."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"key {reprlib.repr(key)} appears twice in one object")
        seen.add(key)
    return dict(pairs)
