"""A request checked, before any work: its options (minigpt.requests.options), then the options and the
prompt against the model, into the Request the loops and the engine run (minigpt.loop.sequence), with
the logits processing it asks for built.
"""

from __future__ import annotations

from ..errors import InputError, MinigptError, shown
from ..loop.processing import Penalties, Processing
from ..loop.sampling import SamplingOptions
from ..loop.sequence import Request
from ..loading.checks import prepare_prompt
from ..loading.model import Model, check_model
from .options import OPTIONS, check_options
from .structured import compile_constraint, one_constraint


def make_request(model: Model, prompt_ids, max_new_tokens: int = 40, **options) -> Request:
    """Check everything about a request before any work: its options (OPTIONS' checks), then the
    options and the prompt against the model. Without a truncate_prompt keyword the caller offers no
    such option, and a prompt too long for the context is refused without pointing to it."""
    check_model(model)
    values = check_options({**options, "max_new_tokens": max_new_tokens})
    return request_of(model, prompt_ids, values, "truncate_prompt" in options)


def request_of(model: Model, prompt_ids, values: dict, truncation_offered: bool) -> Request:
    """The Request of options check_options has checked (not checked again): they and the prompt are
    checked against the model. truncation_offered: the caller has a truncate_prompt option, which a
    prompt too long for the context is refused pointing to."""
    check_against_model(model, values)
    prompt = prepare_prompt(model, prompt_ids, values["max_new_tokens"],
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
    if values["stop"] and getattr(model, "tokenizer_loader", None) is None:
        raise InputError(f"stop strings need the model's tokenizer, and this model's vocabulary "
                         f"({model.config.vocab_size} tokens) is not GPT-2's", "stop")
    outside = [token for token in values["logit_bias"] if token >= model.config.vocab_size]
    if outside:
        raise InputError("{logit_bias} has the token id {value}, outside the vocabulary [0, {vocab_size})",
                         "logit_bias", value=shown(outside[0]), vocab_size=model.config.vocab_size)


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
    check_model(model)
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
            requests.append(make_request(model, prompt, **{name: values[i] for name, values in per_prompt.items()}))
        except MinigptError as e:
            e.prompt = i
            raise
    return requests
