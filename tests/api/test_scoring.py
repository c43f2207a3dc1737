"""minigpt.score: log P(ids[i] | ids[:i]) against transformers, the windows of long texts (lm-eval's
rolling windows at stride n_positions, the Hugging Face perplexity guide's reproduced), and the refusals.

Parity: every log-probability within TOLERANCE (1e-4) x max|logit| of transformers' log_softmax of its
logits gathered at the next tokens, on the committed fixtures (no torch: their logits are transformers'
and the log_softmax is taken here in float64) and live on the random checkpoints of every layout,
including a long text scored in windows by the Hugging Face perplexity guide's own loop.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from parity import FIXTURE_DIRS, KERNELS, LAYOUTS, LIVE_CONFIG, TOLERANCE, make_fixtures

import minigpt
import minigpt.api.scoring
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.gpt2.config import GPT2Config
from minigpt.errors import InputError
from minigpt.loading.model import Model
from minigpt.loading.weights import random_params
from minigpt.loop.sampling import log_softmax


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


def guide_windows(n_tokens: int, n_positions: int, stride: int) -> list[tuple[int, int, range]]:
    """Hugging Face's perplexity guide's loop: windows [begin, end) at begin = 0, stride, 2 * stride, ...,
    each scoring the tokens after the previous window's end (its labels are its inputs, so the token
    after `end` is not scored by that window)."""
    windows, previous_end = [], 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + n_positions, n_tokens)
        windows.append((begin, end, range(max(previous_end, 1), end)))
        previous_end = end
        if end == n_tokens:
            return windows


def test_the_hugging_face_perplexity_guides_windows_are_reproduced_window_by_window(torch, tmp_path,
                                                                                      record_property):
    """150 tokens, 48 positions, stride 20 (overlapping windows): the guide's loop in transformers, and
    the same windows scored with minigpt.score, one window (ids[begin:end]) at a time."""
    save_checkpoint(tmp_path, LIVE_CONFIG, random_params(LIVE_CONFIG, 8, make_fixtures.SCALE))
    ids = np.random.default_rng(9).integers(0, LIVE_CONFIG.vocab_size, 150)
    model = make_fixtures.load_hf(tmp_path, torch.float32, "eager")
    reference, scale = [], 0.0
    windows = guide_windows(len(ids), LIVE_CONFIG.n_positions, 20)
    with torch.inference_mode():
        for begin, end, targets in windows:
            logits = model(torch.tensor(ids[begin:end])[None]).logits[0]  # [end - begin, vocab]
            log_probs = logits.log_softmax(-1).numpy()
            reference += [log_probs[i - 1 - begin, ids[i]] for i in targets]
            scale = max(scale, float(logits.abs().max()))
    errors = {}
    for kernels in KERNELS:
        ours = minigpt.load(tmp_path, kernels=kernels)
        guide = np.concatenate([minigpt.score(ours, ids[begin:end])[targets.start - begin - 1:]
                                for begin, end, targets in windows])
        errors[kernels] = float(np.abs(guide - reference).max() / scale)
    print("the guide's windows through minigpt.score vs its loop: " + ", ".join(f"{e:.2g} [{k}]"
                                                                                for k, e in errors.items()))
    assert max(errors.values()) <= TOLERANCE
    record_property("max_score_error", max(errors.values()))


def lm_eval_rolling_windows(tokens: list[int], prefix: int, max_seq_len: int):
    """lm-evaluation-harness's rolling loglikelihood windows (utils.get_rolling_token_windows with
    context_len=1, then make_disjoint_window): (input ids, the tokens scored, which are the input
    shifted by one). Every token of the document is scored once, with up to max_seq_len tokens of context."""
    first = min(max_seq_len, len(tokens))
    yield [prefix, *tokens[:first - 1]], tokens[:first]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, max_seq_len)
        end = predicted + n
        yield tokens[end - max_seq_len - 1:end - 1], tokens[end - n:end]
        predicted += n


@pytest.mark.parametrize("n_tokens", [48, 49, 95, 96, 97, 150])
def test_stride_n_positions_is_lm_evals_rolling_loglikelihood_in_transformers(torch, tmp_path, n_tokens,
                                                                             record_property):
    """A document after <|endoftext|> (here token 0, as the caller prepends it), scored with
    stride=n_positions: the rolling windows as lm-eval feeds them to transformers, each window's last
    len(scored) rows gathered at the scored tokens."""
    save_checkpoint(tmp_path, LIVE_CONFIG, random_params(LIVE_CONFIG, 8, make_fixtures.SCALE))
    document = np.random.default_rng(n_tokens).integers(1, LIVE_CONFIG.vocab_size, n_tokens - 1).tolist()
    model = make_fixtures.load_hf(tmp_path, torch.float32, "eager")
    reference, scale = [], 0.0
    with torch.inference_mode():
        for inputs, scored in lm_eval_rolling_windows(document, 0, LIVE_CONFIG.n_positions):
            logits = model(torch.tensor(inputs)[None]).logits[0, -len(scored):]  # [len(scored), vocab]
            reference += logits.log_softmax(-1)[torch.arange(len(scored)), torch.tensor(scored)].tolist()
            scale = max(scale, float(logits.abs().max()))
    ids = [0, *document]
    errors = {kernels: float(np.abs(minigpt.score(minigpt.load(tmp_path, kernels=kernels), ids,
                                                  stride=LIVE_CONFIG.n_positions) - reference).max() / scale)
              for kernels in KERNELS}
    print(f"{n_tokens} tokens, stride n_positions vs lm-eval's rolling windows: "
          + ", ".join(f"{e:.2g} [{k}]" for k, e in errors.items()))
    assert len(reference) == n_tokens - 1 and max(errors.values()) <= TOLERANCE
    record_property("max_score_error", max(errors.values()))


def test_a_text_of_n_positions_plus_one_tokens_is_one_full_window_in_transformers(torch, tmp_path):
    """49 tokens on 48 positions: one forward of the first 48, all 48 rows scored, the last with the
    whole context, as transformers' logits on those 48 tokens give them."""
    save_checkpoint(tmp_path, LIVE_CONFIG, random_params(LIVE_CONFIG, 8, make_fixtures.SCALE))
    ids = np.random.default_rng(10).integers(0, LIVE_CONFIG.vocab_size, LIVE_CONFIG.n_positions + 1)
    logits = make_fixtures.hf_reference(tmp_path, ids[:-1], 1)["logits"]  # [48, vocab]
    reference = torch.from_numpy(logits).log_softmax(-1).numpy()[np.arange(len(ids) - 1), ids[1:]]
    model, fed, forward = minigpt.load(tmp_path), [], minigpt.api.scoring.forward
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(minigpt.api.scoring, "forward",
                   lambda gpt, ids, *a, **kw: fed.append(len(ids)) or forward(gpt, ids, *a, **kw))
        ours = minigpt.score(model, ids)
    error = score_error(ours, reference, logits)
    print(f"{len(ids)} tokens on {LIVE_CONFIG.n_positions} positions, one window: {error:.2g} of max|logit|")
    assert fed == [LIVE_CONFIG.n_positions] and error <= TOLERANCE


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
    (3, {0: range(1, 9), 3: range(9, 12), 5: range(12, 14)}),
    (None, {0: range(1, 9), 4: range(9, 13), 5: range(13, 14)}),  # default: n_positions // 2 = 4
    (8, {0: range(1, 9), 5: range(9, 14)}),  # disjoint: each token once, the last window reaching back
    (7, {0: range(1, 9), 5: range(9, 14)}),
    (1, {0: range(1, 9), **{b: range(b + 8, b + 9) for b in range(1, 6)}}),
])
def test_a_text_longer_than_the_context_is_scored_in_windows(small, stride, windows):
    """14 tokens, n_positions 8: the windows written out by hand, each feeding 8 tokens and scoring up to 8
    (its last row predicts the token after it); every token scored exactly once, bitwise as the hand
    computation (the same function of the same rows)."""
    ids = np.random.default_rng(0).integers(0, SMALL.vocab_size, 14)
    assert sorted(i for tokens in windows.values() for i in tokens) == list(range(1, 14))
    expected = by_hand(small, ids, windows)
    assert minigpt.score(small, ids, stride).tobytes() == expected.tobytes()


@pytest.mark.parametrize("n_tokens", [2, 8, 9, 10, 16, 17, 18, 30])
def test_stride_n_positions_is_lm_evals_disjoint_rolling_windows(small, n_tokens):
    """The document after a prefix token, through lm-eval's rolling windows (see lm_eval_rolling_windows)
    fed to model.forward: the same log-probabilities, bit for bit."""
    document = np.random.default_rng(n_tokens).integers(1, SMALL.vocab_size, n_tokens - 1).tolist()
    expected = []
    for inputs, scored in lm_eval_rolling_windows(document, 0, SMALL.n_positions):
        logits = small.forward(inputs)[-len(scored):]  # [len(scored), vocab]
        expected += [log_softmax(row)[token] for row, token in zip(logits, scored)]
    ours = minigpt.score(small, [0, *document], stride=SMALL.n_positions)
    assert ours.tobytes() == np.array(expected).tobytes()


def test_a_text_that_fits_is_one_window_whatever_the_stride(small):
    ids = np.arange(9) * 5 % SMALL.vocab_size  # n_positions + 1: the last row predicts the last token
    one = by_hand(small, ids, {0: range(1, 9)})
    for stride in (None, 1, 8):
        assert minigpt.score(small, ids, stride).tobytes() == one.tobytes()


def test_a_one_position_model_scores_each_token_from_the_one_before(small):
    one = Model(dataclasses.replace(SMALL, n_positions=1), random_params(dataclasses.replace(SMALL, n_positions=1),
                                                                         seed=3, scale=20.0))
    ids = np.array([3, 1, 4, 1, 5])
    expected = [log_softmax(one.forward(ids[i - 1:i])[0])[ids[i]] for i in range(1, 5)]
    assert minigpt.score(one, ids).tobytes() == np.array(expected).tobytes()


@pytest.mark.parametrize(("ids", "stride", "message"), [
    ([], None, "at least 2 tokens"), ([3], None, "at least 2 tokens (the first is only context for the next), got 1"),
    ([1, 2], 0, "stride must be an integer in 1..8, got 0"), ([1, 2], 9, "got 9"), ([1, 2], 2.0, "got 2.0"),
    ([1, 40], None, "token id 40 at index 1 is outside [0, 40)"),
])
def test_bad_input_is_refused(small, ids, stride, message):
    with pytest.raises(InputError, match=re.escape(message)):
        minigpt.score(small, ids, stride)
