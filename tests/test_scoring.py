"""minigpt.score: log P(ids[i] | ids[:i]) against transformers, the sliding windows of long texts, and
the refusals.

Parity: every log-probability within TOLERANCE (1e-4) x max|logit| of transformers' log_softmax of its
logits gathered at the next tokens, on the committed fixtures (no torch: their logits are transformers'
and the log_softmax is taken here in float64) and live on the random checkpoints of every layout,
including a long text scored in windows by the Hugging Face perplexity guide's own loop.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_parity import FIXTURE_DIRS, KERNELS, LAYOUTS, LIVE_CONFIG, TOLERANCE, make_fixtures

import minigpt
from minigpt.checkpoint import save_checkpoint
from minigpt.config import GPT2Config
from minigpt.errors import InputError
from minigpt.model import Model
from minigpt.weights import random_params
from minigpt.sampling import log_softmax


def gathered(log_probs: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log_probs [T, vocab] of rows 0 .. T-2 at the next tokens ids[1:]: [T - 1]."""
    return log_probs[np.arange(len(ids) - 1), ids[1:]]


def score_error(ours: np.ndarray, reference: np.ndarray, logits: np.ndarray) -> float:
    """max |ours - reference| as a fraction of the reference's largest |logit|."""
    assert ours.shape == reference.shape
    return float(np.abs(ours - reference).max() / np.abs(logits).max())


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("directory", FIXTURE_DIRS, ids=lambda d: d.name)
def test_score_matches_the_committed_references_log_softmax(directory, kernels, record_property):
    ref = np.load(directory / make_fixtures.REFERENCE_FILE)
    shifted = ref["logits"].astype(np.float64)  # transformers' [T, vocab]
    shifted -= shifted.max(-1, keepdims=True)
    reference = gathered(shifted - np.log(np.exp(shifted).sum(-1, keepdims=True)), ref["ids"])  # log_softmax
    ours = minigpt.score(minigpt.load(directory, kernels=kernels), ref["ids"])
    error = score_error(ours, reference, ref["logits"])
    print(f"{directory.name} [{kernels}]: score vs transformers' log_softmax: {error:.2g} of max|logit|")
    assert error <= TOLERANCE
    record_property("max_score_error", error)


@pytest.fixture(scope="module")
def torch():
    reason = "live parity needs torch and transformers: pip install -e '.[parity]'"
    pytest.importorskip("transformers", reason=reason)
    return pytest.importorskip("torch", reason=reason)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_score_matches_transformers_live(layout, torch, tmp_path, record_property):
    """Each layout of test_parity: transformers' log_softmax(logits) at the next tokens, both kernel sets
    (hf_reference refuses a checkpoint too ill-conditioned in float32 to decide this)."""
    save_checkpoint(tmp_path, LIVE_CONFIG, random_params(LIVE_CONFIG, 8, make_fixtures.SCALE), **LAYOUTS[layout])
    ids = np.random.default_rng(8).integers(0, LIVE_CONFIG.vocab_size, LIVE_CONFIG.n_positions)
    logits = make_fixtures.hf_reference(tmp_path, ids, 1)["logits"]  # [T, vocab]
    reference = gathered(torch.from_numpy(logits).log_softmax(-1).numpy(), ids)
    errors = {kernels: score_error(minigpt.score(minigpt.load(tmp_path, kernels=kernels), ids), reference, logits)
              for kernels in KERNELS}
    print(f"{layout}: score vs transformers' log_softmax: " + ", ".join(f"{e:.2g} [{k}]" for k, e in errors.items()))
    assert max(errors.values()) <= TOLERANCE
    record_property("max_score_error", max(errors.values()))


def test_a_long_text_is_scored_as_the_hugging_face_perplexity_guide_does(torch, tmp_path, record_property):
    """150 tokens, 48 positions, stride 20: the guide's loop (windows at 0, 20, 40, ...; each scores
    only the tokens after the previous window's end) in transformers, token by token."""
    save_checkpoint(tmp_path, LIVE_CONFIG, random_params(LIVE_CONFIG, 8, make_fixtures.SCALE))
    ids = np.random.default_rng(9).integers(0, LIVE_CONFIG.vocab_size, 150)
    model = make_fixtures.load_hf(tmp_path, torch.float32, "eager")
    reference, scale, previous_end = [], 0.0, 0
    with torch.inference_mode():
        for begin in range(0, len(ids), 20):
            end = min(begin + LIVE_CONFIG.n_positions, len(ids))
            logits = model(torch.tensor(ids[begin:end])[None]).logits[0]  # [end - begin, vocab]
            log_probs = logits.log_softmax(-1).numpy()
            targets = range(max(previous_end, 1), end)  # as the guide's labels: the tokens not scored yet
            reference += [log_probs[i - 1 - begin, ids[i]] for i in targets]
            scale, previous_end = max(scale, float(logits.abs().max())), end
            if end == len(ids):
                break
    errors = {kernels: float(np.abs(minigpt.score(minigpt.load(tmp_path, kernels=kernels), ids, stride=20)
                                    - reference).max() / scale) for kernels in KERNELS}
    print("strided score vs the guide's loop: " + ", ".join(f"{e:.2g} [{k}]" for k, e in errors.items()))
    assert max(errors.values()) <= TOLERANCE
    record_property("max_score_error", max(errors.values()))


# ------------------------------------------------------------------ windows

SMALL = GPT2Config(vocab_size=40, n_positions=8, n_embd=16, n_head=2, n_layer=2, eos_token_id=None)


@pytest.fixture(scope="module")
def small():
    return Model(SMALL, random_params(SMALL, seed=3, scale=20.0))


def by_hand(model: Model, ids: np.ndarray, windows: dict[int, range]) -> np.ndarray:
    """log P(ids[i] | ids[begin:i]) for each window begin and the tokens i it scores, from model.forward."""
    out = np.full(len(ids) - 1, np.nan)
    for begin, tokens in windows.items():
        logits = model.forward(ids[begin:begin + model.config.n_positions])
        for i in tokens:
            out[i - 1] = log_softmax(logits[i - 1 - begin])[ids[i]]
    return out


@pytest.mark.parametrize(("stride", "windows"), [
    (3, {0: range(1, 8), 3: range(8, 11), 6: range(11, 14)}),
    (None, {0: range(1, 8), 4: range(8, 12), 8: range(12, 14)}),  # default: n_positions // 2 = 4
    (7, {0: range(1, 8), 7: range(8, 14)}),  # the least overlap: one token of context at least
    (1, {0: range(1, 8), **{b: range(b + 7, b + 8) for b in range(1, 7)}}),
])
def test_a_text_longer_than_the_context_is_scored_in_windows(small, stride, windows):
    """14 tokens, n_positions 8: the windows written out by hand; every token scored exactly once, bitwise
    as the hand computation (the same function of the same rows)."""
    ids = np.random.default_rng(0).integers(0, SMALL.vocab_size, 14)
    assert sorted(i for tokens in windows.values() for i in tokens) == list(range(1, 14))
    expected = by_hand(small, ids, windows)
    assert minigpt.score(small, ids, stride).tobytes() == expected.tobytes()


def test_a_text_that_fits_is_one_window_whatever_the_stride(small):
    ids = np.arange(8) * 5 % SMALL.vocab_size
    one = by_hand(small, ids, {0: range(1, 8)})
    for stride in (None, 1, 7):
        assert minigpt.score(small, ids, stride).tobytes() == one.tobytes()


@pytest.mark.parametrize(("ids", "stride", "message"), [
    ([], None, "at least 2 tokens"), ([3], None, "at least 2 tokens (the first is only context for the next), got 1"),
    ([1, 2], 0, "stride must be an integer in 1..7"), ([1, 2], 8, "got 8"), ([1, 2], 2.0, "got 2.0"),
    ([1, 40], None, "token id 40 at index 1 is outside [0, 40)"),
])
def test_bad_input_is_refused(small, ids, stride, message):
    with pytest.raises(InputError, match=re.escape(message)):
        minigpt.score(small, ids, stride)
