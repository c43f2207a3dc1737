"""A request, checked once before any work, into the one Request the loops and the engine run
(minigpt.loop.sequence), whichever interface it came from (docs/api.md).

Its options are declared once (OPTIONS: each one's keyword, default, bounds, help and the check of
its value) and checked in one pass with no model (check_options); then they and the prompt are
checked against the model, and the logits processing they ask for is built (make_request). Every
interface takes its options from OPTIONS, so that none can be forgotten in one place: the API's
keywords (takes_options), the command line's flags, batch's keys and the server's fields.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from typing import Callable

from ..errors import InputError, MinigptError, as_float, check_bool, check_ids, check_int, is_int, shown
from ..loop.processing import Penalties, Processing
from ..loop.sampling import MAX_TOP_LOGPROBS, SamplingOptions
from ..loop.sequence import Request, context_error, positions_needed
from ..loading.model import Model
from .structured import CONSTRAINTS, check_value, compile_constraint


DEFAULT_NEW_TOKENS = 40  # max_new_tokens when none is given
MAX_BIAS, MAX_PENALTY = 100, 2  # OpenAI's bounds on logit_bias and on the presence and frequency penalties
# The repetition penalty's bounds: a float32 logit (< 3.5e38) plus a bias, divided or multiplied by at
# most 1e100, stays below 1e139, far inside float64, so no penalised logit is infinite and nothing after
# it makes a NaN (docs/logits-processing.md).
REPETITION_DIGITS = 100
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = float(f"1e-{REPETITION_DIGITS}"), float(f"1e{REPETITION_DIGITS}")
REPETITION_RANGE = f"[1e-{REPETITION_DIGITS}, 1e{REPETITION_DIGITS}]"


@dataclass(frozen=True)
class Option:
    """One option of a request. `check(value, name)` returns the value checked (None: the default's
    meaning) or raises InputError about `name`; `kind` is what a flag's text is read as (bool: a
    switch to the other value, list: repeatable, dict: repeatable ID=VALUE)."""

    name: str  # the keyword of the API and of batch's lines
    default: object
    help: str
    check: Callable[[object, str], object]
    kind: type
    flag: str  # the command line's
    field: str | None  # the server's JSON field; None: the server has none
    batched: bool = True  # also an option of generate_batch, Engine.generate, batch's lines (else: one prompt only)

    def per_prompt(self, value: object) -> bool:
        """Whether generate_batch's `value` for this option is a list of one value per prompt (stop's
        own value is a list: then a list of lists, or of None)."""
        if not isinstance(value, (list, tuple)):
            return False
        return self.kind is not list or any(v is None or isinstance(v, (list, tuple)) for v in value)


def number(ok: Callable[[float], bool], requirement: str) -> Callable[[object, str], object]:
    """A check that the value is a number (not a bool) for which ok(float) holds."""
    def check(value: object, name: str) -> object:
        if not ok(as_float(value)):  # as_float: NaN for anything else, which fails every bound
            raise InputError(f"{{{name}}} must be {requirement}, got {{value}}", name, value=shown(value))
        return value
    return check


def optional(check: Callable[[object, str], object]) -> Callable[[object, str], object]:
    return lambda value, name: None if value is None else check(value, name)


def texts(value: object, name: str) -> tuple[str, ...]:
    """A list of non-empty strings (stop's) as a tuple; None: ()."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise InputError(f"{{{name}}} must be a list of strings, got {{value}}", name, value=shown(value))
    for s in value:
        if not s:
            raise InputError(f"{{{name}}} must not hold an empty string", name)
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{{{name}}} holds {{value}}, which is not valid Unicode text", name, value=shown(s)) from None
    return tuple(value)


def biases(value: object, name: str) -> dict[int, float]:
    """logit_bias: token id -> bias in [-MAX_BIAS, MAX_BIAS], as OpenAI's; None: {}. The ids are
    checked against a model's vocabulary with it (minigpt.requests.request.check_against_model)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"{{{name}}} must be a dict of token ids to biases, got {{value}}", name, value=shown(value))
    for token, bias in value.items():
        if not is_int(token) or token < 0:
            raise InputError(f"{{{name}}} has the key {{value}}: a token id is an integer >= 0", name,
                             value=shown(token))
        if not -MAX_BIAS <= as_float(bias) <= MAX_BIAS:
            raise InputError(f"{{{name}}} gives token {{token}} the bias {{value}}: a bias is a number in "
                             f"[-{MAX_BIAS}, {MAX_BIAS}]", name, token=int(token), value=shown(bias))
    return {int(token): float(bias) for token, bias in value.items()}


def integer(minimum: int, maximum: int | None = None) -> Callable[[object, str], int]:
    return lambda value, name: check_int(value, name, minimum, maximum)


penalty = number(lambda v: -MAX_PENALTY <= v <= MAX_PENALTY, f"a number in [-{MAX_PENALTY}, {MAX_PENALTY}]")
OPTIONS = {option.name: option for option in [
    Option("max_new_tokens", DEFAULT_NEW_TOKENS, "at most this many new tokens", integer(0), int, "--max-new-tokens", "max_tokens"),
    Option("temperature", 0.0, "0 is greedy; higher samples more freely",
           number(lambda v: 0 <= v < math.inf, "a finite number >= 0"), float, "--temperature", "temperature"),
    Option("top_k", None, "sample among the k most likely tokens", optional(integer(1)), int, "--top-k", "top_k"),
    Option("top_p", None, "sample among the smallest set of tokens holding this probability",
           optional(number(lambda v: 0 < v <= 1, "a number in (0, 1]")), float, "--top-p", "top_p"),
    Option("seed", None, "a seed makes sampling reproducible", optional(integer(0)), int, "--seed", "seed"),
    Option("stop_at_eos", True, "end the text at <|endoftext|> (--no-stop: keep going past it)", check_bool, bool,
           "--no-stop", "ignore_eos"),
    Option("stop", None, "end the text before the first of these strings; the tokens run to the one that "
                         "completes it", texts, list, "--stop", "stop"),
    Option("top_logprobs", 0, f"also record the N most likely tokens at each step (N at most {MAX_TOP_LOGPROBS})",
           integer(0, MAX_TOP_LOGPROBS), int, "--top-logprobs", "logprobs"),
    Option("logit_bias", None, f"add a bias in [-{MAX_BIAS}, {MAX_BIAS}] to a token's logit before sampling "
                               f"(+{MAX_BIAS} all but forces it, -{MAX_BIAS} all but bans it)",
           biases, dict, "--logit-bias", "logit_bias"),
    Option("presence_penalty", 0.0, f"in [-{MAX_PENALTY}, {MAX_PENALTY}]: subtract it from the logit of every "
                                    "token already generated", penalty, float, "--presence-penalty", "presence_penalty"),
    Option("frequency_penalty", 0.0, f"in [-{MAX_PENALTY}, {MAX_PENALTY}]: subtract it times the count of each "
                                     "token already generated", penalty, float, "--frequency-penalty",
           "frequency_penalty"),
    Option("repetition_penalty", 1.0, f"in {REPETITION_RANGE}: divide the positive logits of tokens in the prompt "
                                      "or generated by it, multiply the negative ones",
           number(lambda v: MIN_REPETITION_PENALTY <= v <= MAX_REPETITION_PENALTY, f"a number in {REPETITION_RANGE}"),
           float,
           "--repetition-penalty", "repetition_penalty"),
    Option("min_tokens", 0, "neither <|endoftext|> nor a stop string ends the text within this many new tokens",
           integer(0), int, "--min-tokens", "min_tokens"),
    Option("regex", None, "the new text must match this regular expression (llguidance's syntax: Rust's regex)",
           optional(check_value("regex")), str, "--regex", "guided_regex"),
    Option("json_schema", None, "the new text must be JSON valid under this JSON schema",
           optional(check_value("json_schema")), str, "--json-schema", "guided_json"),
    Option("choice", None, "the new text must be one of these strings", optional(check_value("choice")), list,
           "--choice", "guided_choice"),
    Option("grammar", None, "the new text must match this Lark grammar (or llama.cpp's GBNF)",
           optional(check_value("grammar")), str, "--grammar", "guided_grammar"),
    Option("truncate_prompt", False, "if prompt + new tokens - 1 (the last is never fed) exceed the context, keep "
                                     "only the prompt's last tokens", check_bool, bool, "--truncate-prompt", None,
           batched=False),
]}


CHECKED_DEFAULTS = {name: option.check(option.default, name) for name, option in OPTIONS.items()}


def check_options(values: dict, checked_before: dict | None = None) -> dict:
    """Every option checked, keyword -> value, the absent ones at their values in `checked_before`
    (check_options' own result: the command line's under a batch line's) or at their defaults, each
    checked once, in CHECKED_DEFAULTS. Needs no model (make_request checks against one)."""
    before = checked_before or {}
    checked = {}
    for name, option in OPTIONS.items():
        if name not in values:
            checked[name] = before.get(name, CHECKED_DEFAULTS[name])
        else:
            value = values[name]
            checked[name] = CHECKED_DEFAULTS[name] if value is option.default else option.check(value, name)
    one_constraint(checked)
    if checked["min_tokens"] > checked["max_new_tokens"]:
        raise InputError("{min_tokens} must be at most {max_new_tokens} ({maximum}), got {value}", "min_tokens",
                         value=checked["min_tokens"], maximum=checked["max_new_tokens"])
    return checked


def one_constraint(values: dict) -> tuple[str, object] | None:
    """(kind, value) of the one constraint among checked options (keyword -> value), or None; an
    InputError about the second when two are given."""
    given = [kind for kind in CONSTRAINTS if values.get(kind) is not None]
    if len(given) > 1:
        raise InputError(f"{{{given[0]}}} and {{{given[1]}}} both constrain the text: give at most one of "
                         + ", ".join(f"{{{kind}}}" for kind in CONSTRAINTS), given[1])
    return (given[0], values[given[0]]) if given else None


def make_request(model: Model, prompt_ids, values: dict, truncation_offered: bool) -> Request:
    """The Request of options check_options has checked (not checked again): they and the prompt are
    checked against the model. truncation_offered: the caller has a truncate_prompt option, which a
    prompt too long for the context is refused pointing to."""
    check_against_model(model, values)
    prompt = check_prompt(model, prompt_ids, values["max_new_tokens"],
                          values["truncate_prompt"] if truncation_offered else None)
    eos = model.config.eos_token_id if values["stop_at_eos"] else None
    # the text, the stop strings and a constraint need the tokenizer: it is built now, before any work
    tokenizer = None if model.tokenizer_loader is None else model.tokenizer
    token_bytes = None if tokenizer is None else tokenizer.decode_single_token_bytes
    sampling = SamplingOptions(values["temperature"], values["top_k"], values["top_p"], values["seed"])
    return Request(tuple(prompt), int(values["max_new_tokens"]), sampling, eos, values["stop"], values["top_logprobs"],
                   token_bytes, values["min_tokens"], processing(values, tokenizer, eos))


def check_against_model(model: Model, values: dict) -> None:
    """Checked options against the model: stop strings need its tokenizer, logit_bias's ids its vocabulary."""
    if values["stop"] and model.tokenizer_loader is None:
        raise InputError(f"stop strings need the model's tokenizer, and this model's vocabulary "
                         f"({model.config.vocab_size} tokens) is not GPT-2's", "stop")
    outside = [token for token in values["logit_bias"] if token >= model.config.vocab_size]
    if outside:
        raise InputError("{logit_bias} has the token id {value}, outside the vocabulary [0, {vocab_size})",
                         "logit_bias", value=shown(outside[0]), vocab_size=model.config.vocab_size)


def check_prompt(model: Model, prompt_ids, max_new_tokens: int, truncate_prompt: bool | None = None) -> list[int]:
    """A prompt checked before any work (max_new_tokens checked), as it is fed: its ids, and that the
    generation fits in n_positions (positions_needed: the last new token is never fed, so prompt + new
    tokens - 1 positions).

    An empty prompt starts from <|endoftext|>, as GPT-2's unconditional samples do. With
    `truncate_prompt`, a prompt too long to leave room for the new tokens keeps its last tokens;
    None: the caller has no such option, and the error offers none.
    """
    config = model.config
    ids = check_ids(prompt_ids, config.vocab_size, "prompt_ids").tolist()
    if not ids:
        if config.eos_token_id is None:
            raise InputError("the prompt is empty and this model's vocabulary has no <|endoftext|> to start from",
                             "prompt_ids")
        ids = [config.eos_token_id]
    room = config.n_positions - positions_needed(0, max_new_tokens)  # the longest prompt that fits
    if len(ids) > room:
        if not truncate_prompt or room < 1:
            raise context_error(config.n_positions, len(ids), max_new_tokens, "prompt_ids",
                                truncatable=truncate_prompt is not None and room >= 1)
        ids = ids[-room:]
    return ids


def processing(values: dict, tokenizer, eos: int | None) -> tuple[Processing, ...]:
    """The logits processing checked options ask for (minigpt.loop.processing), none when they change
    nothing: the penalties, then a constraint compiled for the tokenizer (last: a mask must win over
    the biases), which allows <|endoftext|> only if the sequence stops at it (eos)."""
    penalties = Penalties(tuple(values["logit_bias"]), tuple(values["logit_bias"].values()),
                          float(values["presence_penalty"]), float(values["frequency_penalty"]),
                          float(values["repetition_penalty"]))
    constraint = one_constraint(values)
    if constraint is not None:
        constraint = compile_constraint(tokenizer, *constraint, tokenizer is not None and eos == tokenizer.eot_token)
    return tuple(p for p in (None if penalties == Penalties() else penalties, constraint) if p is not None)


def make_requests(model: Model, prompts, options: dict) -> list[Request]:
    """One checked Request per prompt. Each option is one value for all prompts or a list with one
    value per prompt (Option.per_prompt). A bad request is named by its index, before any work."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
        raise InputError("{prompts} must be a list of token-id lists", "prompts")
    per_prompt = {}
    for name, value in options.items():
        listed = OPTIONS[name].per_prompt(value)
        if listed and len(value) != len(prompts):
            raise InputError(f"{{{name}}} has {len(value)} values for {len(prompts)} prompts", name)
        per_prompt[name] = value if listed else [value] * len(prompts)
    requests = []
    for i, prompt in enumerate(prompts):
        try:
            own = {name: values[i] for name, values in per_prompt.items()}
            requests.append(make_request(model, prompt, check_options(own), False))
        except MinigptError as e:
            e.prompt = i
            raise
    return requests


def takes_options(batched: bool) -> Callable:
    """A function of `**options` given every option's keyword and default in its signature (batched:
    only the batched ones): an unknown keyword is Python's TypeError, and the function receives
    every option."""
    def decorate(function: Callable) -> Callable:
        signature = inspect.signature(function)
        own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        added = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default)
                 for o in OPTIONS.values() if o.name not in signature.parameters and (o.batched or not batched)]
        full = signature.replace(parameters=own + added)

        @functools.wraps(function)
        def call(*args, **kwargs):
            try:
                bound = full.bind(*args, **kwargs)
            except TypeError as e:  # as Python words it for a function of its own
                raise TypeError(f"{function.__qualname__}() {e}") from None
            bound.apply_defaults()
            return function(*bound.args, **bound.kwargs)

        call.__signature__ = full
        return call
    return decorate
