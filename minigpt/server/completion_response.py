"""OpenAI's completions answer: a CompletionRequest's results shaped into its JSON, whole or as
streamed chunks (minigpt.server.completion_request checks the request; minigpt.server.serve
puts both on a socket).
"""

from __future__ import annotations

import codecs
import time

from .completion_request import CompletionRequest
from ..loop.sequence import GenerationResult, StreamedToken

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


def finish_reason(result: GenerationResult) -> str:
    return FINISH_REASONS[result.finish_reason]


def logprobs_json(tokenizer, request: CompletionRequest, tokens: list[int], logprobs: list, top: list | None,
                  offsets: list[int]) -> dict:
    """OpenAI's logprobs object for these tokens at these text offsets (TextOffsets).
    top: per token, the N most likely (id, logprob), or None for a position that has none."""
    return {"tokens": [request.token_name(tokenizer, t) for t in tokens], "token_logprobs": logprobs,
            "top_logprobs": None if top is None else [None if step is None else top_dict(tokenizer, request, step)
                                                      for step in top],
            "text_offset": offsets}


class TextOffsets:
    """Where each token begins in the text: the characters decoded from the tokens before it, so a
    token that ends inside a character begins where that character does, and the next one after it
    (as vLLM counts them from its incremental detokenizer)."""

    def __init__(self, tokenizer, start: int = 0):
        self.tokenizer, self.chars = tokenizer, start
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def of(self, tokens: list[int]) -> list[int]:
        offsets = []
        for token in tokens:
            offsets.append(self.chars)
            self.chars += len(self.decoder.decode(self.tokenizer.decode_single_token_bytes(token)))
        return offsets


def top_dict(tokenizer, request: CompletionRequest, step: list[tuple[int, float]]) -> dict[str, float]:
    """The most likely tokens as OpenAI gives them, name -> logprob, most likely first (two tokens
    with one text, such as two bytes decoded as U+FFFD, keep the likelier)."""
    top: dict[str, float] = {}
    for token, logprob in step:
        top.setdefault(request.token_name(tokenizer, token), logprob)
    return top


def prompt_part(tokenizer, request: CompletionRequest, index: int, result: GenerationResult,
                offsets: TextOffsets) -> tuple[str, dict | None]:
    """What echo puts first: the prompt's text and, with logprobs, its tokens' (the first null). A
    prompt sent empty echoes nothing: the <|endoftext|> it started from is not its text."""
    empty = request.empty[index // request.n]
    ids = [] if empty else list(result.prompt_ids)
    text = tokenizer.decode(ids)
    if request.logprobs is None:
        offsets.of(ids)
        return text, None
    top = result.prompt_top_logprobs if request.logprobs else None
    scored = slice(len(result.prompt_ids) - len(ids), None)
    return text, logprobs_json(tokenizer, request, ids, result.prompt_logprobs[scored],
                               None if top is None else top[scored], offsets.of(ids))


def choice_json(tokenizer, request: CompletionRequest, index: int, result: GenerationResult) -> dict:
    """One choice of a whole answer."""
    offsets = TextOffsets(tokenizer)
    text, logprobs = prompt_part(tokenizer, request, index, result, offsets) if request.echo else ("", None)
    if request.logprobs is not None:
        top = result.top_logprobs if request.logprobs else None
        new = logprobs_json(tokenizer, request, result.tokens, result.logprobs, top, offsets.of(result.tokens))
        logprobs = new if logprobs is None else {key: joined(logprobs[key], new[key]) for key in new}
    return {"index": index, "text": text + result.text, "logprobs": logprobs,
            "finish_reason": finish_reason(result)}


def joined(a: list | None, b: list | None) -> list | None:
    return None if a is None else a + b


def usage_json(request: CompletionRequest, results: list[GenerationResult]) -> dict:
    """Tokens counted as OpenAI counts them, over every candidate's result: each prompt once, every
    candidate's new tokens (the best_of not chosen too); cached: each prompt's first candidate's
    positions taken from the prefix cache."""
    firsts = results[::request.best_of]
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

    def __init__(self, tokenizer, request: CompletionRequest, index: int):
        self.tokenizer, self.request, self.index = tokenizer, request, index
        self.offsets = TextOffsets(tokenizer)

    def echo(self, result: GenerationResult) -> dict:
        """The first chunk of an echo: the prompt's text and, with logprobs, its tokens' (once scored)."""
        text, logprobs = prompt_part(self.tokenizer, self.request, self.index, result, self.offsets)
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": None}

    def chunk(self, records: list[StreamedToken], result: GenerationResult | None) -> dict:
        """The chunk of these newly released tokens; result: the choice's, when they are its last."""
        tokens = [r.token for r in records]
        logprobs = None
        if self.request.logprobs is not None:
            top = [r.top_logprobs for r in records] if self.request.logprobs else None
            logprobs = logprobs_json(self.tokenizer, self.request, tokens, [r.logprob for r in records], top,
                                     self.offsets.of(tokens))
        return {"index": self.index, "text": "".join(r.text for r in records), "logprobs": logprobs,
                "finish_reason": None if result is None else finish_reason(result)}
