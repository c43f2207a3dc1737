"""minigpt.testing, the reader's tools, tested: the bit oracle sees what == does not and names the
first difference; the strategies draw every request option the declaration has and checkpoints that
load; and `import minigpt` works without Hypothesis (only minigpt.testing needs it)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigpt
from minigpt.loading.checkpoint import load_checkpoint
from minigpt.requests.request import OPTIONS, check_options
from minigpt.loading.weights import params_to_tensors
from minigpt.exact.kernels import EXACT, FAST
from minigpt.engine.job import EngineResult
from minigpt.gpt2.layers import PLAIN, Kernels, attend
from minigpt.engine.drafters import ModelDrafter, NGramDrafter
from minigpt.gpt2.config import GPT2Config
from minigpt.loading.model import Model
from minigpt.loading.weights import random_params
from minigpt.testing import assert_bitwise, check_drafter, check_kernels
from minigpt.testing.bits import first_difference
from minigpt.testing.kernels import blas_threads
from minigpt.testing.strategies import DRAWN, checkpoints, models, options


def test_equal_bits_pass_including_the_same_nan():
    a = np.array([[1.0, -0.0, np.nan]], np.float32)
    assert first_difference(a, a.copy()) is None
    assert_bitwise({"x": [a, [1, 2], 0.5]}, {"x": [a.copy(), [1, 2], 0.5]})


def test_the_sign_of_zero_and_one_flipped_bit_are_differences_named_by_row_and_element():
    a = np.zeros((3, 4), np.float32)
    b = a.copy()
    b[1, 2] = -0.0  # == calls it equal
    b[2, 0] = np.nextafter(np.float32(0), np.float32(1))
    with pytest.raises(AssertionError) as e:
        assert_bitwise(a, b, what="logits")
    assert str(e.value) == ("logits: 2 of 12 elements differ; rows differing: 2 of 3; the first at row 1, element 2: "
                            "0.0 (bits 0x0) != -0.0 (bits 0x80000000)")


@pytest.mark.parametrize("b", [np.zeros((2, 3), np.float64), np.zeros((3, 2), np.float32)], ids=["dtype", "shape"])
def test_a_different_dtype_or_shape_is_a_difference(b):
    with pytest.raises(AssertionError, match="dtype|shape"):
        assert_bitwise(np.zeros((2, 3), np.float32), b)


def test_results_differ_by_the_first_token_or_log_probability_named_with_both_bit_patterns(tiny_model):
    result = minigpt.generate(tiny_model, [1, 2, 3], 4)
    engine_s = EngineResult(**{**vars(result), "step_seconds": [0.0] * 4}, preemptions=3, cached_tokens=16)
    assert_bitwise(result, engine_s)  # timings and the engine's counters are not content
    later = dataclasses.replace(result, logprobs=[*result.logprobs[:2], np.nextafter(result.logprobs[2], 0), 0.0])
    with pytest.raises(AssertionError, match=r"^alone vs batched\.logprobs\[2\]: .* \(bits 0x[0-9a-f]+\) != .* \(bits "):
        assert_bitwise(result, later, "alone vs batched")
    with pytest.raises(AssertionError, match=r"\.tokens\[1\]: \d+ != -1$"):
        assert_bitwise(result, dataclasses.replace(result, tokens=[result.tokens[0], -1, *result.tokens[2:]]), "r")
    with pytest.raises(AssertionError, match=r"ids: length 3 != 2; the first goes on with 3"):
        assert_bitwise([1, 2, 3], [1, 2], "ids")


def test_the_options_strategy_draws_every_batched_option_but_max_new_tokens():
    assert DRAWN == {name for name, o in OPTIONS.items() if o.batched} - {"max_new_tokens"}


@given(st.data())
def test_drawn_options_pass_the_declaration_s_checks(data):
    model = data.draw(models())
    n = data.draw(st.integers(0, 8))
    check_options({**data.draw(options(model, n)), "max_new_tokens": n})


@given(checkpoints())
def test_drawn_checkpoints_load_to_the_stored_weights(tmp_path_factory, checkpoint):
    config, params = load_checkpoint(checkpoint.write(tmp_path_factory.mktemp("checkpoint")))
    assert config == checkpoint.config
    assert params_to_tensors(params).keys() == params_to_tensors(checkpoint.params).keys()
    if checkpoint.dtype == "float32":
        assert_bitwise(params_to_tensors(params), params_to_tensors(checkpoint.params), "weights")


def test_minigpt_imports_and_generates_without_hypothesis_and_minigpt_testing_names_the_extra():
    script = ("import sys; sys.modules['hypothesis'] = None\n"  # an import of it fails, as if not installed
              "import minigpt\n"
              "print(minigpt.generate(minigpt.load('random-tiny'), [1, 2], 2).tokens)\n"
              "try:\n    import minigpt.testing\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tokens, message = out.stdout.splitlines()
    assert tokens.startswith("[") and message == "minigpt.testing needs Hypothesis: pip install 'minigpt[testing]'"


def test_check_kernels_passes_the_exact_kernels():
    check_kernels(EXACT, max_examples=15)


def reader_s_own(x, w, b):
    """A reader's linear map in plain NumPy: one product for all rows."""
    return x @ w if b is None else x @ w + b


@pytest.mark.parametrize("kernels", [FAST, PLAIN, Kernels("mine", reader_s_own, attend)],
                         ids=["fast", "plain", "a reader's x @ w"])
def test_check_kernels_fails_a_set_whose_rows_change_with_the_batch_giving_the_falsifying_example(kernels):
    with pytest.raises(AssertionError) as e:
        check_kernels(kernels, max_examples=50)
    assert f"{kernels.name}.linear's row" in str(e.value) and "(bits 0x" in str(e.value)
    assert "linear_row_alone_or_with_others(" in "\n".join(e.value.__notes__)  # the falsifying example


def test_blas_threads_sets_openblas_s_count_and_gives_it_back():
    from minigpt.testing.kernels import _openblas_threads

    found = _openblas_threads()
    if found is None:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS whose thread count can be set")
    before = found[1]()
    with blas_threads(1):
        assert found[1]() == 1
    assert found[1]() == before


SMALL = GPT2Config(vocab_size=24, n_positions=40, n_embd=8, n_layer=2, n_head=2, eos_token_id=23)
SMALL_MODEL = Model(SMALL, random_params(SMALL, seed=5, scale=30.0))


class RandomDrafter:
    """Random guesses, nearly always wrong, never harmful."""

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def propose(self, ids, k, options, rng):
        return self.rng.integers(SMALL.vocab_size, size=k).tolist(), None

    def accepted(self, n_positions):
        pass


class OneTooMany(RandomDrafter):
    def propose(self, ids, k, options, rng):
        return self.rng.integers(SMALL.vocab_size, size=k + 1).tolist(), None


class UnnormalisedQ(RandomDrafter):
    def propose(self, ids, k, options, rng):
        drafts = self.rng.integers(SMALL.vocab_size, size=k).tolist()
        return drafts, np.full((k, SMALL.vocab_size), 0.5)


@pytest.mark.parametrize("drafter", [NGramDrafter(), ModelDrafter(SMALL_MODEL, SMALL.n_positions), RandomDrafter()],
                         ids=["prompt lookup", "the model as its own draft", "random guesses"])
def test_check_drafter_passes_drafters_that_keep_the_contract(drafter):
    check_drafter(drafter, SMALL_MODEL, max_examples=15)


@pytest.mark.parametrize("drafter, breach", [(OneTooMany(), "drafts where"), (UnnormalisedQ(), "sums to")],
                         ids=["k + 1 drafts", "q not a distribution"])
def test_check_drafter_names_a_breach_of_the_contract(drafter, breach):
    with pytest.raises(AssertionError, match=breach) as e:
        check_drafter(drafter, SMALL_MODEL, max_examples=15)
    assert "every_proposal_keeps_the_contract(" in "\n".join(e.value.__notes__)


def test_check_kernels_sees_a_linear_map_whose_bits_follow_the_blas_thread_count():
    from minigpt.exact.attention import exact_attend
    from minigpt.exact.linear import exact_linear
    from minigpt.testing.kernels import _openblas_threads

    found = _openblas_threads()
    if found is None or found[1]() < 2:
        pytest.skip("needs an OpenBLAS whose thread count can be set, running 2 threads or more")

    def by_threads(x, w, b):  # exact, but for its last bit at more than one thread
        y = exact_linear(x, w, b)
        return np.nextafter(y, np.inf) if found[1]() > 1 else y

    with pytest.raises(AssertionError, match="at 1 BLAS thread vs this process's count"):
        check_kernels(Kernels("threads", by_threads, exact_attend), max_examples=5)
