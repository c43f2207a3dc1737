"""OpenAI's completions request, without the HTTP: a body checked into one CompletionRequest, which
holds minigpt Requests (the answer is shaped by minigpt.server.completion_response; minigpt.server.serve
puts both on a socket).

The fields are the declared options' and the API's own (n, best_of, echo, stream, ...), checked by
the library's own checks, so the server refuses exactly what `minigpt.generate` refuses, naming the
API's fields. Choice (or best_of candidate) j of a prompt samples with seed + j (docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from dataclasses import dataclass
from typing import Iterator

from ..requests.request import OPTIONS, check_options, make_request
from ..requests.token_keys import from_json
from ..requests.structured import CONSTRAINTS
from ..errors import ContextLengthError, InputError, MinigptError, check_int, unique_keys
from ..loading.model import Model
from ..loop.sequence import GenerationResult, Request
from ..loading.tokenizer import encode, no_tokenizer, token_text

OPENAI_DEFAULTS = {"max_new_tokens": 16, "temperature": 1.0}  # OpenAI's, where they are not the library's
MAX_N = 128  # OpenAI's bound on `n`
MAX_BEST_OF = 20  # OpenAI's bound on `best_of`
MAX_STOP_STRINGS, MAX_STOP_CHARS = 32, 1000  # stop strings are matched at every token: bounded, as OpenAI bounds them
# options whose field the API shapes its own way (a constraint comes from one of several fields)
READ_HERE = ("stop_at_eos", "top_logprobs", "stop", *CONSTRAINTS)
FIELDS = ("model", "prompt", "n", "best_of", "echo", "stream", "stream_options", "user", "suffix", "return_tokens_as_token_ids",
          "structured_outputs", "response_format", *(o.field for o in OPTIONS.values() if o.field))  # suffix: only null
STRUCTURED = {"regex": "regex", "json": "json_schema", "choice": "choice", "grammar": "grammar",
              "json_object": "json_schema"}  # vLLM's structured_outputs keys -> the library's keywords


class APIError(InputError):
    """A request the API refuses: OpenAI's error body {"error": {message, type, param, code}} and a
    status. Its message is final, worded as the API names its fields; `param` is the field."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def message(self, name=str, subject: bool = True) -> str:
        return self.args[0]

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class CompletionRequest:
    """A checked completions request: one Request per prompt, and how to answer."""

    requests: list[Request]  # one per prompt; candidate j of prompt i is candidate i * best_of + j
    n: int
    best_of: int  # candidates per prompt (n unless asked for): the n best are its choices
    seed: int  # the request's, or drawn for it: candidate j samples with seed + j
    echo: bool
    logprobs: int | None  # None: no logprobs; 0: the chosen tokens' only; N: and the N most likely
    stream: bool
    include_usage: bool
    empty: list[bool]  # per prompt: it was empty, so it starts from <|endoftext|>, which echo does not show
    token_ids: bool = False  # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N", not by text

    def token_name(self, tokenizer, token: int) -> str:
        """A token as the logprobs name it: its text, or "token_id:N"."""
        return f"token_id:{token}" if self.token_ids else token_text(tokenizer, token)

    @property
    def prompt_logprobs(self) -> bool:
        """echo with logprobs: the prompt's tokens are scored too."""
        return self.echo and self.logprobs is not None

    def candidates(self) -> Iterator[Request]:
        """Every candidate's Request, in order: prompt i's with seed + j for its candidate j."""
        for request in self.requests:
            for j in range(self.best_of):
                yield dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=self.seed + j))

    def choices(self, results: list[GenerationResult]) -> list[GenerationResult]:
        """The choices among the candidates' results (in candidate order): each prompt's candidates
        themselves, or with best_of > n its n of highest cumulative log-probability, highest first
        (the earlier candidate first on a tie)."""
        if self.best_of == self.n:
            return results
        chosen = []
        for i in range(0, len(results), self.best_of):
            candidates = results[i:i + self.best_of]
            chosen += sorted(candidates, key=lambda r: -sum(r.logprobs))[:self.n]
        return chosen


def parse_json(body: bytes) -> dict:
    """The body as a JSON object, or an APIError saying why not: it must be UTF-8 (not another
    encoding JSON allows), hold no key twice in an object (which one would count?), and no lone
    surrogate (an escape such as \\ud800 that is no Unicode text)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(f"the body is not UTF-8: {e}") from None
    try:
        value = json.loads(text, object_pairs_hook=unique_keys)
    except (ValueError, RecursionError) as e:  # not JSON, a key twice, nested too deeply
        raise APIError(f"the body is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise APIError(f"the body must be a JSON object, got {type(value).__name__}")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError("the body holds a lone surrogate (an escape such as \\ud800 that is no Unicode text)") from None
    return value


def completion_request(model: Model, served_name: str, body: dict, capacity: int) -> CompletionRequest:
    """A completions body checked before any work (APIError naming the field), with OpenAI's
    defaults and a random seed when none is given; more candidates than `capacity` (what the server
    can ever hold in flight) is a 400, counted before any prompt is encoded."""
    unknown = [key for key in body if key not in FIELDS]
    if unknown:
        raise APIError(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
    check_model_name(body.get("model"), served_name)
    option(body, "suffix", None, lambda v: False, "null (minigpt does not insert text)")
    n = option(body, "n", 1, lambda v: check_int(v, "n", 1) <= MAX_N, f"an integer in 1..{MAX_N}")
    best_of = option(body, "best_of", n, lambda v: n <= check_int(v, "best_of", 1) <= MAX_BEST_OF,
                     f"an integer in n..{MAX_BEST_OF} (n is {n})")
    logprobs = body.get("logprobs")  # None: no logprobs; else checked with the options, as top_logprobs
    echo, stream, ignore_eos, token_ids = (option(body, name, False, lambda v: isinstance(v, bool), "true or false")
                                           for name in ("echo", "stream", "ignore_eos", "return_tokens_as_token_ids"))
    if stream and best_of > n:
        raise APIError(f"best_of ({best_of}) above n ({n}) cannot be streamed: the best candidates are known only "
                       "when all have finished", "best_of")
    include_usage = check_stream_options(body.get("stream_options"), stream)
    option(body, "user", None, lambda v: isinstance(v, str), "a string")
    candidates = prompt_count(body.get("prompt")) * best_of
    if candidates > capacity:
        raise APIError(f"{candidates} candidates asked for (prompts x best_of, or n), and this server holds at most "
                       f"{capacity} in flight (--max-batch-size + --max-queue): send fewer prompts or a smaller n",
                       "best_of" if best_of > n else "n", "too_many_choices")
    options = {name: from_json(name, body[o.field]) for name, o in OPTIONS.items()
               if o.field and name not in READ_HERE and body.get(o.field) is not None}
    constraint = constraint_field(body)  # (field, keyword, value) or None
    if constraint is not None:
        options[constraint[1]] = constraint[2]
    options = {**{name: value for name, value in OPENAI_DEFAULTS.items() if name not in options}, **options,
               "stop_at_eos": not ignore_eos, "stop": check_stop_field(body.get("stop")),
               "top_logprobs": 0 if logprobs is None else logprobs}
    if options.get("seed") is None:
        options["seed"] = secrets.randbits(63)  # OpenAI samples at random without a seed: so does the server
    prompts = prompt_ids(model, body["prompt"])
    fields = {constraint[1]: constraint[0]} if constraint else {}
    try:
        values = check_options(options)  # once, for every prompt's request
    except MinigptError as e:
        raise library_error(e, len(prompts), fields) from None
    requests = []
    for i, ids in enumerate(prompts):
        try:
            requests.append(make_request(model, ids, values, False))
        except MinigptError as e:
            e.prompt = i
            raise library_error(e, len(prompts), fields) from None
    empty = [not ids for ids in prompts]  # started from <|endoftext|>, which echo does not show
    return CompletionRequest(requests, n, best_of, requests[0].sampling.seed, echo,
                             None if logprobs is None else values["top_logprobs"], stream, include_usage, empty,
                             token_ids)


def constraint_field(body: dict) -> tuple[str, str, object] | None:
    """(the field, the library's keyword, the value) of the one constraint a body asks for, or None:
    vLLM's `structured_outputs` object (regex, json, choice, grammar, json_object: true), its older
    guided_regex, guided_json, guided_choice and guided_grammar, or OpenAI's response_format
    (json_object: any JSON object; json_schema: its `schema`). Two are a 400 naming the second."""
    found = [(o.field, name, body[o.field]) for name, o in OPTIONS.items()
             if name in CONSTRAINTS and body.get(o.field) is not None]
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if not isinstance(outputs, dict):
            raise APIError(f"structured_outputs must be an object, got {json.dumps(outputs)[:80]}", "structured_outputs")
        for key, value in outputs.items():
            name = f"structured_outputs.{key}"
            if key not in STRUCTURED:
                raise APIError(f"{name} is not supported: structured_outputs takes {', '.join(STRUCTURED)}", name)
            if key == "json_object" and not (value is None or isinstance(value, bool)):  # 1 == True: not a bool
                raise APIError(f"{name} must be true or false, got {json.dumps(value)[:80]}", name)
            if value is not None and value is not False:
                found.append((name, STRUCTURED[key], {"type": "object"} if key == "json_object" else value))
    response_format = body.get("response_format")
    if response_format is not None:
        found += response_format_constraint(response_format)
    if len(found) > 1:
        raise APIError(f"{found[0][0]} and {found[1][0]} both constrain the text: give at most one", found[1][0])
    return found[0] if found else None


def response_format_constraint(response_format) -> list[tuple[str, str, object]]:
    """OpenAI's response_format as a constraint: [] for text, any JSON object for json_object, and
    json_schema's `schema` ({"type": "json_schema", "json_schema": {"name", "schema", ...}})."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return []
    if kind == "json_object":
        return [("response_format", "json_schema", {"type": "object"})]
    schema = response_format.get("json_schema") if kind == "json_schema" else None
    if isinstance(schema, dict) and schema.get("schema") is not None:
        return [("response_format.json_schema.schema", "json_schema", schema["schema"])]
    raise APIError('response_format must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                   f'"json_schema": {{"name": ..., "schema": {{...}}}}}}, got {json.dumps(response_format)[:80]}',
                   "response_format")


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


def check_stop_field(stop) -> list[str] | None:
    """`stop`: null, a string or a list of at most MAX_STOP_STRINGS strings of at most MAX_STOP_CHARS
    characters each (the library checks that none is empty)."""
    if stop is None:
        return None
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise APIError(f"stop must be a string or a list of strings, got {json.dumps(stop)[:80]}", "stop")
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise APIError(f"stop takes at most {MAX_STOP_STRINGS} strings of at most {MAX_STOP_CHARS} characters "
                       f"each, got {len(stops)} (the longest {max(map(len, stops), default=0)})", "stop")
    return stops or None


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


def prompt_count(prompt) -> int:
    """How many prompts `prompt` holds: a string or a list of ids is one; a list of strings or of
    id lists, one each (APIError for anything else)."""
    if isinstance(prompt, str) or isinstance(prompt, list) and prompt and all(
            isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return 1
    if isinstance(prompt, list) and prompt and (all(isinstance(p, str) for p in prompt)
                                                or all(isinstance(p, list) for p in prompt)):
        return len(prompt)
    raise APIError("prompt must be a string, a list of strings, a list of token ids or a list of token-id lists, "
                   f"got {json.dumps(prompt)[:80]}", "prompt")


def prompt_ids(model: Model, prompt) -> list:
    """The prompts (already counted by prompt_count) as token-id lists; ids themselves are checked by
    make_request."""
    if isinstance(prompt, str):
        return [encode_text(model, prompt)]
    if isinstance(prompt[0], str):
        return [encode_text(model, p) for p in prompt]
    return prompt if isinstance(prompt[0], list) else [prompt]


def encode_text(model: Model, text: str) -> list[int]:
    """A text's ids (minigpt.encode: "<|endoftext|>" in it is the special token, as OpenAI's and vLLM's
    GPT-2 tokenize it)."""
    if model.tokenizer is None:
        raise APIError(f"{no_tokenizer(model.config.vocab_size)}: send token ids", "prompt")
    return encode(model.tokenizer, text)


def field(keyword: str) -> str:
    """The API's field for a library keyword: an option's declared field, `prompt` for the prompt's ids
    (and the server's own option, as its command line names it, for the pool's size)."""
    option = OPTIONS.get(keyword)
    if option is not None and option.field:
        return option.field
    return {"prompt_ids": "prompt", "kv_cache_tokens": "--kv-cache-tokens"}.get(keyword, keyword)  # the server's own


def library_error(error: MinigptError, prompts: int, fields: dict[str, str] | None = None) -> APIError:
    """The library's error as the API's: its message naming the API's fields (`fields`: keyword ->
    the field this request used, where the API has several) and its prompt, when the request has
    several; its param the field."""
    where = f"prompt {error.prompt}: " if error.prompt is not None and prompts > 1 else ""
    code = "context_length_exceeded" if isinstance(error, ContextLengthError) else None
    name = lambda keyword: (fields or {}).get(keyword) or field(keyword)  # noqa: E731
    return APIError(where + error.message(name), None if error.param is None else name(error.param), code)
