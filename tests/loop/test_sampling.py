"""Sampling: greedy is argmax; temperature, top-k and top-p filter as Hugging Face's logits warpers."""

from __future__ import annotations

import numpy as np
import pytest

from minigpt.requests.request import check_options
from minigpt.errors import InputError
from minigpt.loop.sampling import SamplingOptions, filtered_log_probs, next_token


def kept(logits, **options) -> set[int]:
    return set(np.flatnonzero(np.isfinite(filtered_log_probs(np.asarray(logits, np.float32),
                                                             SamplingOptions(temperature=1.0, **options)))))


def test_greedy_is_argmax_and_ignores_the_rng():
    logits = np.array([0.1, 3.0, -1.0, 2.9], np.float32)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    assert next_token(logits, SamplingOptions(), rng) == 1
    assert rng.bit_generator.state == state
    for best in (0, 3):  # the first and the last id too
        peaked = logits.copy()
        peaked[best] = 9.0
        assert next_token(peaked, SamplingOptions(), rng) == best


def test_a_tiny_temperature_is_greedy_not_nan():
    logits = np.array([0.1, 3.0, -1.0, 2.9], np.float32) * 100
    for t in (1e-320, 1e-30, 1e-6):
        assert next_token(logits, SamplingOptions(temperature=t), np.random.default_rng(0)) == 1


def test_top_k_keeps_the_k_largest():
    assert kept([1, 5, 3, 4, 2], top_k=2) == {1, 3}


def test_top_p_keeps_the_smallest_set_holding_p():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs)
    assert kept(logits, top_p=0.5) == {0}
    assert kept(logits, top_p=0.75) == {0, 1}
    assert kept(logits, top_p=0.81) == {0, 1, 2}
    assert kept(logits, top_p=1.0) == {0, 1, 2, 3}


def test_filtered_probabilities_sum_to_one_and_follow_temperature():
    logits = np.array([1.0, 2.0, 3.0], np.float32)
    for t in (0.5, 1.0, 2.0):
        p = np.exp(filtered_log_probs(logits, SamplingOptions(temperature=t)))
        assert p.sum() == pytest.approx(1.0)
        assert p[2] / p[1] == pytest.approx(np.exp(1 / t))


def test_seeded_sampling_is_reproducible_and_follows_the_distribution():
    logits = np.log(np.array([0.7, 0.2, 0.1], np.float32))
    options = SamplingOptions(temperature=1.0)

    def draws(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        return [next_token(logits, options, rng) for _ in range(50)]

    assert draws(7) == draws(7) != draws(8)
    rng = np.random.default_rng(0)
    counts = np.bincount([next_token(logits, options, rng) for _ in range(4000)], minlength=3) / 4000
    assert np.abs(counts - [0.7, 0.2, 0.1]).max() < 0.03


def test_matches_hugging_face_warpers_where_installed():
    torch = pytest.importorskip("torch", reason="torch (the `parity` extra) is needed for the reference")
    generation = pytest.importorskip("transformers.generation.logits_process",
                                     reason="transformers (the `parity` extra) is the reference")
    rng = np.random.default_rng(3)
    for _ in range(20):
        logits = rng.standard_normal(50).astype(np.float32) * 3
        t, k, p = 0.7, int(rng.integers(1, 50)), float(rng.uniform(0.05, 1.0))
        scores = torch.from_numpy(logits)[None].double() / t
        scores = generation.TopKLogitsWarper(k)(None, scores)
        scores = generation.TopPLogitsWarper(p)(None, scores)
        ref = set(np.flatnonzero(np.isfinite(scores[0].numpy())))
        assert kept(logits / t, top_k=k, top_p=p) == ref


@pytest.mark.parametrize("options, word", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(seed=-1), "seed"),
])
def test_bad_options_are_refused_naming_the_option(options, word):
    with pytest.raises(InputError, match=word) as error:
        check_options(options)
    assert error.value.param == word
