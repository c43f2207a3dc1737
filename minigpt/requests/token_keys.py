"""Options given as text, as JSON bodies, batch lines and flags give them, turned into what the API
takes: the keys of an option of ID=VALUE pairs (logit_bias) read as the token ids they name, one key
per token.
"""

from __future__ import annotations

from ..errors import InputError, shown
from .request import OPTIONS


def from_json(name: str, value: object) -> object:
    """A JSON value (a batch line's, a request body's) as the API takes it: JSON's keys are strings,
    so the ids of an option of ID=VALUE pairs (logit_bias) come as "50256" (by_token)."""
    if OPTIONS[name].kind is dict and isinstance(value, dict):
        return by_token(value.items(), name)
    return value


MAX_ID_DIGITS = 18  # an id of more digits (leading zeros aside) is in no vocabulary


def token_key(key: object, name: str) -> object:
    """A key of an option of ID=VALUE pairs given as text (JSON's, a flag's) as the token id it names:
    ASCII digits, leading zeros allowed ("05" is 5). Any other key is left for the check to name; one
    of more than MAX_ID_DIGITS digits is refused before Python's limit on converting long digit strings."""
    if not (isinstance(key, str) and key.isascii() and key.isdecimal()):
        return key
    digits = key.lstrip("0") or "0"
    if len(digits) > MAX_ID_DIGITS:
        raise InputError(f"{{{name}}} has the key {{value}}, a number of {len(digits):,} digits: no vocabulary "
                         "has such a token id", name, value=shown(key))
    return int(digits)


def by_token(pairs, name: str) -> dict:
    """(key as text, value) pairs as token id -> value (token_key): one key per token, so two keys
    naming the same token ("5" and "05") are refused, as a body's duplicate keys are."""
    named: dict = {}  # token id (or a key that is none) -> (its key, its value)
    for key, value in pairs:
        token = token_key(key, name)
        if token in named:
            raise InputError(f"{{{name}}} names token {{token}} twice, as {{first}} and {{value}}: give each "
                             "token one key", name, token=shown(token), first=shown(named[token][0]), value=shown(key))
        named[token] = key, value
    return {token: value for token, (_, value) in named.items()}
