"""One exception hierarchy for every mistake a user can make and every fault minigpt detects.

The CLI catches `MinigptError` and prints its message as one line `error: ...`; anything else
escaping is a bug in minigpt, not a user's mistake.
"""

import math
import numbers
import reprlib

import numpy as np


class MinigptError(Exception):
    """Base class: the message names the problem and, where it can, what to do."""


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
    """An Engine driven from a second thread, or from inside one of its own calls (an on_step, or the
    loop over its results): one engine is driven from one thread at a time."""


class NumericalError(MinigptError):
    """The forward's activations stopped being finite: finite weights too large for float32 overflowed.
    In a batch, `sequence` is the engine's job whose logits did (its index and ids name and trace it)."""

    def __init__(self, message: str, sequence: object = None):
        super().__init__(message)
        self.sequence = sequence


def shown(value: object) -> str:
    """`value` as a message shows it: its repr, a long one abridged (reprlib), and an integer too long
    for Python to print (more than 4,300 digits: repr raises ValueError) by its number of digits."""
    try:
        return reprlib.repr(value)
    except ValueError:
        if isinstance(value, numbers.Integral):
            return f"an integer of about {int(abs(int(value)).bit_length() * math.log10(2)):,} digits"
        return f"a {type(value).__name__} holding an integer too long to print"


def check_int(value: object, name: str, minimum: int, error: type[MinigptError] = InputError,
              maximum: int | None = None) -> int:
    """`value` as an int if it is an integer (Python or NumPy, not bool) in minimum..maximum (no
    maximum: >= minimum); else `error` naming it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum \
            or maximum is not None and value > maximum:
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise error(f"{name} must be an integer {bound}, got {shown(value)}")
    return int(value)


def check_bool(value: object, name: str) -> bool:
    """`value` if it is True or False (Python or NumPy); else InputError: a string such as "no" would be true."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be True or False, got {shown(value)}")
    return bool(value)
