"""The bookkeeping every loop shares (minigpt.sequence): log-probabilities, finish reasons, and stop
strings matched across token boundaries, never cutting a character, never left in the result."""

from __future__ import annotations

import numpy as np
import pytest

from minigpt.sampling import SamplingOptions, log_softmax, top_log_probs
from minigpt.sequence import Request, Sequence, generated_text, incomplete_tail

# A made-up vocabulary of byte strings: "é" is b"\xc3\xa9", split over tokens 5 and 6.
VOCAB = [b"a", b"E", b"N", b"D", b"xE", b"\xc3", b"\xa9END", b"<|endoftext|>", b" ", b"\xa9"]
EOS = 7
LOGITS = np.linspace(-2, 2, len(VOCAB), dtype=np.float32)


def sequence(stop=(), max_new_tokens=20, top=0, eos=EOS) -> Sequence:
    return Sequence(Request((0,), max_new_tokens, SamplingOptions(), eos, tuple(stop), top, VOCAB.__getitem__))


def feed(seq: Sequence, tokens: list[int]) -> Sequence:
    for t in tokens:
        if seq.done:
            break
        seq.append(t, LOGITS, 0.0)
    return seq


def text(seq: Sequence) -> bytes:
    return b"".join(VOCAB[t] for t in seq.tokens)


def test_logprobs_are_the_raw_log_softmax_and_top_logprobs_the_most_likely_first():
    seq = feed(sequence(top=3), [0, 2])
    reference = np.log(np.exp(LOGITS.astype(np.float64)) / np.exp(LOGITS.astype(np.float64)).sum())
    assert seq.logprobs == pytest.approx(reference[[0, 2]], abs=1e-6)  # float32 exponentials, float64 sum
    assert [t for t, _ in seq.top_logprobs[0]] == [9, 8, 7]
    assert seq.logprobs[0] == log_softmax(LOGITS)[0]  # the same function, the same bits


def test_top_logprobs_breaks_ties_by_the_lower_id():
    assert top_log_probs(np.array([0.0, -1.0, 0.0, 0.0]), 2) == [(0, 0.0), (2, 0.0)]


def test_a_stop_string_is_matched_across_token_boundaries_and_left_out():
    seq = feed(sequence(stop=["END"]), [0, 1, 2, 3, 0])
    assert seq.finish_reason == "stop"
    assert seq.tokens == [0] and text(seq) == b"a"
    assert len(seq.logprobs) == len(seq.seconds) == 1


def test_a_token_straddling_the_stop_string_is_dropped_with_its_text():
    seq = feed(sequence(stop=["END"]), [0, 4, 2, 3])  # "a" "xE" "N" "D": "x" precedes the stop inside "xE"
    assert seq.tokens == [0] and seq.finish_reason == "stop"


def test_the_result_never_ends_inside_a_multibyte_character():
    seq = feed(sequence(stop=["END"]), [0, 5, 6])  # "a" + "\xc3" + "\xa9END": "é" is split over two tokens
    assert seq.tokens == [0]  # "\xc3" alone would end inside "é"
    assert incomplete_tail(text(seq)) == 0
    seq = feed(sequence(stop=["END"]), [0, 5, 9, 1, 2, 3])  # "é" whole before the stop
    assert text(seq) == "aé".encode()


def test_tokens_that_may_begin_a_stop_string_are_held_back_then_released():
    seq = feed(sequence(stop=["END"]), [0, 1])
    assert seq.released == 1  # "E" could begin "END"
    feed(seq, [0])
    assert seq.released == 3 and not seq.done  # "Ea" cannot
    feed(seq, [5])
    assert seq.released == 3  # an unfinished character is held too
    feed(seq, [9])
    assert seq.released == 5


def test_finish_reasons_and_end_of_text():
    seq = feed(sequence(), [0, EOS, 0])
    assert seq.finish_reason == "eos" and seq.tokens == [0, EOS]
    assert feed(sequence(max_new_tokens=2), [0, 0, 0]).finish_reason == "length"
    assert feed(sequence(eos=None, max_new_tokens=3), [EOS, 0, 0]).tokens == [EOS, 0, 0]  # stop_at_eos=False
    assert sequence(max_new_tokens=0).finish_reason == "length"


def test_the_text_of_a_result_leaves_out_the_end_of_text_that_ended_it(tokenizer):
    seq = Sequence(Request((0,), 5, SamplingOptions(), 50256, token_bytes=tokenizer.decode_single_token_bytes))
    for t in tokenizer.encode(" hello") + [50256]:
        seq.append(t, np.zeros(50257, np.float32), 0.0)
    assert generated_text(tokenizer, seq.result(use_cache=True)) == " hello"


@pytest.mark.parametrize("stop", [5, "END", {"END": 1}, ["END", 3]])
def test_stop_must_be_a_list_of_strings(stop):
    import minigpt
    from minigpt.errors import InputError

    with pytest.raises(InputError, match="stop must be a list of strings"):
        minigpt.generate(minigpt.load("random-tiny"), [1], 3, stop=stop)
