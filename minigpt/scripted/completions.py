"""OpenAI's completions API over minigpt, without the HTTP: a request body checked into minigpt
Requests, and results shaped into OpenAI's JSON (minigpt.scripted.serve puts it on a socket).

Every option is checked by the library's own checks (make_request, check_ids, check_stop), so the
server refuses exactly what `minigpt.generate` refuses, with the library's message (its keyword
names replaced by the API's: max_new_tokens is max_tokens, top_logprobs is logprobs). A choice is
one Request; choice j of a prompt samples with seed + j, so each equals `minigpt.generate` with
that seed alone (docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Iterator

from .api import make_request
from ..errors import ContextLengthError, InputError, MinigptError, check_int
from ..loading.model import Model
from ..loop.sequence import GenerationResult, Request, StreamedToken
from ..loading.tokenizer import encode, token_text

DEFAULT_MAX_TOKENS = 16  # OpenAI's
MAX_LOGPROBS = 20  # OpenAI's bound on `logprobs`
MAX_N = 128  # OpenAI's bound on `n`
FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop", "logprobs", "echo",
          "stream", "stream_options", "ignore_eos", "user",
          "suffix", "best_of", "logit_bias", "presence_penalty", "frequency_penalty")  # the last five: only if inert
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
LIBRARY_NAMES = {"max_new_tokens": "max_tokens", "top_logprobs": "logprobs"}  # the library's keyword -> the API's
PARAM_OF_MESSAGE = (("token id", "prompt"), ("the prompt", "prompt"), ("temperature", "temperature"),
                    ("top_k", "top_k"), ("top_p", "top_p"), ("seed", "seed"), ("max_new_tokens", "max_tokens"),
                    ("top_logprobs", "logprobs"), ("stop", "stop"), ("a stop string", "stop"))


class APIError(InputError):
    """A request the API refuses: OpenAI's error body {"error": {message, type, param, code}} and a status."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Completion:
    """A checked completions request: one Request per prompt, and how to answer."""

    requests: list[Request]  # one per prompt; choice j of prompt i is choice i * n + j
    n: int
    seed: int  # the request's, or drawn for it: choice j samples with seed + j
    echo: bool
    logprobs: int | None  # None: no logprobs; 0: the chosen tokens' only; N: and the N most likely
    stream: bool
    include_usage: bool

    @property
    def prompt_logprobs(self) -> bool:
        """echo with logprobs: the prompt's tokens are scored too."""
        return self.echo and self.logprobs is not None

    def choices(self) -> Iterator[Request]:
        """Every choice's Request, in choice order: prompt i's with seed + j for its choice j."""
        for request in self.requests:
            for j in range(self.n):
                yield dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=self.seed + j))


def parse_json(body: bytes) -> dict:
    """The body as a JSON object, or an APIError saying why not."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deeply
        raise APIError(f"the body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise APIError(f"the body must be a JSON object, got {type(value).__name__}")
    return value


def check_completion(model: Model, served_name: str, body: dict, room: int) -> Completion:
    """A completions body checked before any work (APIError naming the field), with OpenAI's defaults:
    max_tokens 16, temperature 1, n 1, and a seed drawn from the system's randomness when none is given.
    More choices than `room` (what the server can take now) is a 429, before a Request is made."""
    unknown = [key for key in body if key not in FIELDS]
    if unknown:
        raise APIError(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    check_model_name(body.get("model"), served_name)
    check_unsupported(body)
    n = option(body, "n", 1, lambda v: check_int(v, "n", 1) <= MAX_N, f"an integer in 1..{MAX_N}")
    logprobs = option(body, "logprobs", None, lambda v: 0 <= check_int(v, "logprobs", 0) <= MAX_LOGPROBS,
                      f"an integer in 0..{MAX_LOGPROBS}")
    echo, stream, ignore_eos = (option(body, name, False, lambda v: isinstance(v, bool), "true or false")
                                for name in ("echo", "stream", "ignore_eos"))
    include_usage = check_stream_options(body.get("stream_options"), stream)
    option(body, "user", None, lambda v: isinstance(v, str), "a string")
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbits(63)  # OpenAI samples at random without a seed: so does the server
    stop = body.get("stop")
    prompts = prompt_ids(model, body.get("prompt"))
    if len(prompts) * n > room:
        raise APIError(f"the server is busy: {len(prompts) * n} choices asked for, room for {max(room, 0)} now "
                       "(--max-batch-size + --max-queue in flight); retry later", None, "queue_full", 429,
                       "rate_limit_error")
    options = dict(temperature=1.0 if body.get("temperature") is None else body["temperature"],
                   top_k=body.get("top_k"), top_p=body.get("top_p"), seed=seed, stop_at_eos=not ignore_eos,
                   stop=[stop] if isinstance(stop, str) else stop or None, top_logprobs=logprobs or 0)
    max_tokens = DEFAULT_MAX_TOKENS if body.get("max_tokens") is None else body["max_tokens"]
    requests = []
    for i, ids in enumerate(prompts):
        try:
            requests.append(make_request(model, ids, max_tokens, **options))
        except MinigptError as e:
            raise library_error(e, f"prompt {i}: " if len(prompts) > 1 else "") from None
    return Completion(requests, n, requests[0].sampling.seed, echo, logprobs, stream, include_usage)


def option(body: dict, name: str, default, ok, requirement: str):
    """body[name] (default when absent or null) if ok(value); else an APIError naming the field."""
    value = body.get(name)
    if value is None:
        return default
    try:
        good = ok(value)
    except MinigptError:
        good = False
    if not good:
        raise APIError(f"{name} must be {requirement}, got {json.dumps(value)[:80]}", name)
    return value


def check_model_name(name, served_name: str) -> None:
    if name is not None and name != served_name:
        raise APIError(f"The model `{name}` does not exist: this server serves `{served_name}`", "model",
                       "model_not_found", 404)


def check_unsupported(body: dict) -> None:
    """400 naming the first field set to something minigpt does not do (each accepted when inert)."""
    inert = {"suffix": lambda v: v is None, "logit_bias": lambda v: not v,
             "best_of": lambda v: v is None or v == body.get("n", 1),
             "presence_penalty": lambda v: v is None or v == 0, "frequency_penalty": lambda v: v is None or v == 0}
    for name, ok in inert.items():
        if name in body and not ok(body[name]):
            raise APIError(f"{name} is not supported by this server (got {json.dumps(body[name])[:80]})", name,
                           "unsupported_parameter")


def check_stream_options(stream_options, stream: bool) -> bool:
    """include_usage from stream_options, which only a streamed request may carry."""
    if stream_options is None:
        return False
    if not stream:
        raise APIError("stream_options is only allowed with stream: true", "stream_options")
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"} or \
            not isinstance(stream_options.get("include_usage", False), bool):
        raise APIError(f"stream_options must be {{\"include_usage\": true or false}}, got "
                       f"{json.dumps(stream_options)[:80]}", "stream_options")
    return stream_options.get("include_usage", False)


def prompt_ids(model: Model, prompt) -> list:
    """The prompts as token-id lists (ids themselves are checked by make_request): a string, a list
    of strings, a list of ids, or a list of id lists."""
    if isinstance(prompt, str):
        return [encode_text(model, prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [encode_text(model, p) for p in prompt]
        if all(isinstance(p, int) for p in prompt):
            return [prompt]
        if all(isinstance(p, list) for p in prompt):
            return prompt
    raise APIError("prompt must be a string, a list of strings, a list of token ids or a list of token-id lists, "
                   f"got {json.dumps(prompt)[:80]}", "prompt")


def encode_text(model: Model, text: str) -> list[int]:
    """A text's ids (minigpt.encode: "<|endoftext|>" in it is the special token, as OpenAI's and vLLM's
    GPT-2 tokenize it)."""
    if model.tokenizer is None:
        raise APIError(f"this model's vocabulary has {model.config.vocab_size} tokens, not GPT-2's, so it has no "
                       "tokenizer for text: send token ids", "prompt")
    return encode(model.tokenizer, text)


def library_error(error: MinigptError, prefix: str) -> APIError:
    """The library's error as the API's: its keywords renamed, its field found from the message."""
    message = re.sub("|".join(LIBRARY_NAMES), lambda m: LIBRARY_NAMES[m[0]], str(error))
    if isinstance(error, ContextLengthError):
        return APIError(prefix + message, "prompt", "context_length_exceeded")
    param = next((p for start, p in PARAM_OF_MESSAGE if str(error).startswith(start)), None)
    return APIError(prefix + message, param)


# ------------------------------------------------------------------------------ answers


def finish_reason(result: GenerationResult) -> str:
    return FINISH_REASONS[result.finish_reason]


def logprobs_json(tokenizer, tokens: list[int], logprobs: list, top: list | None, offset: int) -> dict:
    """OpenAI's logprobs object for these tokens; text_offset counts characters from `offset`.
    top: per token, the N most likely (id, logprob), or None for a position that has none."""
    texts = [token_text(tokenizer, t) for t in tokens]
    offsets = []
    for text in texts:
        offsets.append(offset)
        offset += len(text)
    return {"tokens": texts, "token_logprobs": logprobs,
            "top_logprobs": None if top is None else [None if step is None else top_dict(tokenizer, step)
                                                      for step in top],
            "text_offset": offsets}


def top_dict(tokenizer, step: list[tuple[int, float]]) -> dict[str, float]:
    """The most likely tokens as OpenAI gives them, text -> logprob, most likely first (two tokens
    with one text, such as two bytes shown as U+FFFD, keep the likelier)."""
    top: dict[str, float] = {}
    for token, logprob in step:
        top.setdefault(token_text(tokenizer, token), logprob)
    return top


def prompt_part(tokenizer, completion: Completion, result: GenerationResult) -> tuple[str, dict | None]:
    """What echo puts first: the prompt's text and, with logprobs, its tokens' (the first null)."""
    text = tokenizer.decode(result.prompt_ids)
    if completion.logprobs is None:
        return text, None
    top = result.prompt_top_logprobs if completion.logprobs else None
    return text, logprobs_json(tokenizer, result.prompt_ids, result.prompt_logprobs, top, 0)


def choice_json(tokenizer, completion: Completion, index: int, result: GenerationResult) -> dict:
    """One choice of a whole answer."""
    text, logprobs = prompt_part(tokenizer, completion, result) if completion.echo else ("", None)
    if completion.logprobs is not None:
        top = result.top_logprobs if completion.logprobs else None
        new = logprobs_json(tokenizer, result.tokens, result.logprobs, top, len(text))
        logprobs = new if logprobs is None else {key: joined(logprobs[key], new[key]) for key in new}
    return {"index": index, "text": text + result.text, "logprobs": logprobs,
            "finish_reason": finish_reason(result)}


def joined(a: list | None, b: list | None) -> list | None:
    return None if a is None else a + b


def usage_json(completion: Completion, results: list[GenerationResult]) -> dict:
    """Tokens counted as OpenAI counts them: each prompt once, every choice's new tokens; cached:
    each prompt's first choice's positions taken from the prefix cache."""
    firsts = results[::completion.n]
    prompt = sum(len(r.prompt_ids) for r in firsts)
    new = sum(len(r.tokens) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new,
            "prompt_tokens_details": {"cached_tokens": sum(r.cached_tokens for r in firsts)}}


def envelope(identity: str, served_name: str, choices: list[dict], created: int | None = None) -> dict:
    return {"id": identity, "object": "text_completion", "created": int(time.time()) if created is None else created,
            "model": served_name, "choices": choices, "system_fingerprint": None}


class ChoiceStream:
    """One choice as streamed chunks: each released token's share of the text, and its logprobs'
    text_offset carried on from chunk to chunk."""

    def __init__(self, tokenizer, completion: Completion, index: int):
        self.tokenizer, self.completion, self.index = tokenizer, completion, index
        self.offset = 0

    def echo(self, result: GenerationResult) -> dict:
        """The first chunk of an echo: the prompt's text and, with logprobs, its tokens' (once scored)."""
        text, logprobs = prompt_part(self.tokenizer, self.completion, result)
        self.offset = len(text)
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": None}

    def chunk(self, records: list[StreamedToken], result: GenerationResult | None) -> dict:
        """The chunk of these newly released tokens; result: the choice's, when they are its last."""
        tokens = [r.token for r in records]
        logprobs = None
        if self.completion.logprobs is not None:
            top = [r.top_logprobs for r in records] if self.completion.logprobs else None
            logprobs = logprobs_json(self.tokenizer, tokens, [r.logprob for r in records], top, self.offset)
        self.offset += sum(len(token_text(self.tokenizer, t)) for t in tokens)
        return {"index": self.index, "text": "".join(r.text for r in records), "logprobs": logprobs,
                "finish_reason": None if result is None else finish_reason(result)}
