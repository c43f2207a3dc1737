"""Stop strings through the real loops: `stream` never yields what `generate` would not return, and
both follow the specification that OpenAI's API, vLLM, Hugging Face and lm-eval share.

The model's choices are scripted (Sequence.choose returns the next token of a list), so that the
tokens are the awkward ones: characters split over byte tokens (" caf", b"\\xc3", b"\\xc3", b"\\xa9"),
stop strings inside, across and at the edges of tokens. Everything else, the forwards, the loops,
the stop matching and the release of held-back tokens, is what a user runs.
"""

from __future__ import annotations

from unittest import mock

from hypothesis import example, given
from hypothesis import strategies as st

import minigpt
from minigpt.loop.sequence import Sequence

# Single GPT-2 tokens: "é" whole (c3 a9) and as its two bytes, the four bytes of "🙂" (f0 9f 99 82), and text.
PIECES = [b" caf", b"\xc3", b"\xa9", "é".encode(), " é".encode(), " caf\u00e9".encode(), b"\xf0", b"\x9f", b"\x99",
          b"\x82", b" E", b"N", b"D", b"END", b"ND", b"EN", b"e", b"\n"]
STOPS = st.sampled_from(["é", "END", "ND", "caf", "fé", "\n", "é E", "🙂", "e"]) | st.text("aEND é\n🙂", min_size=1,
                                                                                             max_size=4)


def expected(pieces: list[bytes], stops: list[str]) -> tuple[int, str | None]:
    """The specification: the tokens up to and including the first one after which the bytes hold a
    stop string, and the text before that string's first occurrence (None: no stop string found)."""
    for n in range(1, len(pieces) + 1):
        data = b"".join(pieces[:n])
        found = [data.find(s.encode()) for s in stops if s.encode() in data]
        if found:
            return n, data[:min(found)].decode("utf-8", errors="replace")
    return len(pieces), None


@given(chosen=st.lists(st.sampled_from(PIECES), min_size=1, max_size=10), stops=st.lists(STOPS, min_size=1,
                                                                                          max_size=3),
       use_cache=st.booleans())
@example(chosen=[b" caf", b"\xc3", b"\xc3", b"\xa9"], stops=["é"], use_cache=True)
def test_streamed_texts_concatenate_to_generates_text_and_streamed_tokens_are_a_prefix_of_generates(
        tiny_model, tokenizer, chosen, stops, use_cache):
    """Property: for any tokens and stop strings, at every token `stream` yields, the tokens so far are
    a prefix of `generate`'s (with the same log-probabilities); at the end they are all of them, and
    the streamed texts concatenated are generate's text, which is the specification's."""
    ids = [tokenizer.encode_single_token(piece) for piece in chosen]
    options = dict(stop=stops, stop_at_eos=False, use_cache=use_cache)
    with mock.patch.object(Sequence, "choose", lambda self, logits: ids[len(self.tokens)]):
        result = minigpt.generate(tiny_model, [464], len(ids), **options)
        streamed = []
        for record in minigpt.stream(tiny_model, [464], len(ids), **options):
            streamed.append(record)
            assert [r.token for r in streamed] == result.tokens[:len(streamed)]
            assert [r.logprob for r in streamed] == result.logprobs[:len(streamed)]
    assert [r.token for r in streamed] == result.tokens
    assert "".join(r.text for r in streamed) == result.text
    n, text = expected(chosen, stops)
    assert result.tokens == ids[:n]
    assert result.finish_reason == ("length" if text is None else "stop")
    assert result.text == (b"".join(chosen).decode("utf-8", errors="replace") if text is None else text)
