"""The bookkeeping every loop shares (minigpt.loop.sequence): log-probabilities, finish reasons, and stop
strings matched across token boundaries, never cutting a character, never left in the result."""

from __future__ import annotations

import numpy as np
import pytest

from minigpt.loop.sampling import SamplingOptions, log_softmax, top_log_probs
from minigpt.loop.sequence import Request, Sequence
from minigpt.loop.stops import StopMatcher

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


def test_a_stop_string_is_matched_across_token_boundaries_and_the_text_ends_before_it():
    seq = feed(sequence(stop=["END"]), [0, 1, 2, 3, 0])  # "a" "E" "N" "D": the stop string completes at "D"
    assert seq.finish_reason == "stop"
    assert seq.tokens == [0, 1, 2, 3] and seq.result(True).text == "a"  # every token up to the one completing it
    assert len(seq.logprobs) == len(seq.seconds) == 4


def test_a_token_straddling_the_stop_string_keeps_its_text_before_the_stop():
    seq = feed(sequence(stop=["END"]), [0, 4, 2, 3])  # "a" "xE" "N" "D": "x" precedes the stop inside "xE"
    assert seq.tokens == [0, 4, 2, 3] and seq.finish_reason == "stop"
    assert seq.result(True).text == "ax"
    seq = feed(sequence(stop=["N"]), [0, 6])  # the stop string inside one token: "\xa9END" after "a"
    assert seq.result(True).text == "a\ufffdE"  # a byte that only continues a character: U+FFFD


def test_the_earliest_stop_string_completed_in_a_token_ends_the_text():
    """Two stop strings completed by the same token: the text ends before the one that begins first."""
    seq = feed(sequence(stop=["ND", "xEN"]), [0, 4, 2, 3])  # "xEN" completes at "N", before "ND" exists
    assert seq.tokens == [0, 4, 2] and seq.result(True).text == "a"
    seq = feed(sequence(stop=["D", "aE"]), [0, 1, 3])  # "aE" completes first, with "E"
    assert seq.tokens == [0, 1] and seq.result(True).text == ""


def test_a_stop_string_after_half_a_character_leaves_it_as_the_replacement_character():
    seq = feed(sequence(stop=["END"]), [0, 5, 6])  # "a" + "\xc3" + "\xa9END": "é" is split over two tokens
    assert seq.tokens == [0, 5, 6] and seq.result(True).text == "aé"
    seq = feed(sequence(stop=["é"]), [0, 5, 5, 9])  # "\xc3" "\xc3" "\xa9": the stop string is the second "é"
    assert seq.tokens == [0, 5, 5, 9] and seq.result(True).text == "a\ufffd"


def test_tokens_are_held_back_while_their_text_may_begin_a_stop_string_then_released_with_it():
    seq = feed(sequence(stop=["END"]), [0, 1])
    assert seq.released == 1 and seq.texts == ["a"]  # "E" could begin "END"
    feed(seq, [0])
    assert seq.released == 3 and not seq.done and seq.texts == ["a", "E", "a"]  # "Ea" cannot
    feed(seq, [5])
    assert seq.released == 4 and seq.texts[3] == ""  # half a character: released, its text comes with the rest
    feed(seq, [9])
    assert seq.released == 5 and seq.texts[4] == "é"


def test_held_back_tokens_cut_by_the_stop_string_add_no_text():
    seq = feed(sequence(stop=["END"]), [0, 1, 2, 3])
    assert seq.released == 4 and seq.texts == ["a", "", "", ""]


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
    assert seq.result(use_cache=True).text == " hello"


def test_without_a_tokenizer_there_is_no_text():
    seq = feed(Sequence(Request((0,), 3, SamplingOptions(), EOS)), [0, 1, 2])
    assert seq.released == 3 and seq.result(True).text is None
    assert [t.text for t in seq.streamed(0)] == [None] * 3


@pytest.mark.parametrize("stops, data, found", [
    ([b"aab"], b"aaab", 1), ([b"abab", b"bab"], b"xabab", 1), ([b"abc"], b"ababd", None),
    ([b"\xc3\xa9"], b"\xc3\xc3\xa9", 1),
])
def test_the_stop_matcher_finds_each_stop_string_however_the_bytes_arrive(stops, data, found):
    """Fed all at once or a byte at a time (the partial matches carried across feeds): the same offset."""
    assert StopMatcher(tuple(stops)).feed(data) == found
    matcher = StopMatcher(tuple(stops))
    offsets = [matcher.feed(data[i:i + 1]) for i in range(len(data))]
    assert next((o for o in offsets if o is not None), None) == found


def test_the_stop_matcher_holds_only_what_may_still_begin_a_stop_string():
    matcher = StopMatcher((b"abcab", b"xy"))
    matcher.feed(b"zzabca")
    assert matcher.open_from == 2  # "abca" begins "abcab"
    matcher.feed(b"x")
    assert matcher.open_from == 6  # only "x" may still begin one ("xy")


@pytest.mark.parametrize("stop", [5, "END", {"END": 1}, ["END", 3]])
def test_stop_must_be_a_list_of_strings(stop, tiny_model):
    import minigpt
    from minigpt.errors import InputError

    with pytest.raises(InputError, match="stop must be a list of strings"):
        minigpt.generate(tiny_model, [1], 3, stop=stop)
