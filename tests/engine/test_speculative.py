"""Speculative decoding: the drafters, the refusals, the counts, and statistical tests that sampled
speculative tokens follow the model's own distribution exactly (and that the tests would notice if
they did not).

The statistical tests draw N tokens with fixed seeds and compare their counts with the expected
distribution by Pearson's chi-square test at significance 0.001; the critical value comes from the
Wilson-Hilferty approximation. A correct sampler fails such a test once in a thousand seeds; these
seeds are fixed, so the tests are deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
from checkpoints import tiny
from chi_square import chi_square_rejects

import minigpt
from minigpt.engine import speculative
from minigpt.gpt2.config import GPT2Config
from minigpt.errors import ContextLengthError, DrafterError, InputError
from minigpt.loading.model import Model
from minigpt.loading.weights import random_params
from minigpt.loop.sampling import SamplingOptions, filtered_log_probs
from minigpt.loop.sequence import Request, Sequence
from minigpt.engine.drafters import NGramDrafter
from minigpt.engine.speculative import verify

# --------------------------------------------------------------------------- drafters


def test_prompt_lookup_proposes_what_followed_the_latest_earlier_occurrence():
    ids = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    drafts, q = NGramDrafter().propose(ids, 3, SamplingOptions(), None)
    assert drafts == [7, 8, 5] and q is None  # "2 3" last seen before 7 8 5
    assert NGramDrafter().propose([4, 5, 6], 3, SamplingOptions(), None) == ([], None)  # no match
    assert NGramDrafter().propose([5, 6, 5], 4, SamplingOptions(), None)[0] == [6, 5, 6, 5]  # repeats with period 2
    assert NGramDrafter().propose([1, 7, 7, 7], 3, SamplingOptions(), None)[0] == [7, 7, 7]  # a cycle of one token


@pytest.mark.parametrize("drafts, tokens", [
    ([1, 2, 3], [1, 2, 4]),  # third draft wrong: the model's 4 instead
    ([1, 2, 4], [1, 2, 4, 0]),  # all right: plus the bonus token
    ([], [1]),  # no drafts: a plain step
])
def test_greedy_verification_keeps_confirmed_drafts_then_the_models_own_token(drafts, tokens):
    logits = np.eye(5, dtype=np.float32)[[1, 2, 4, 0]]  # argmax per row: 1, 2, 4, 0
    seq = Sequence(Request((0,), 10, SamplingOptions(), None))
    assert verify(seq, logits[:len(drafts) + 1], drafts, None, 0.0) == len(tokens) - 1
    assert seq.tokens == tokens


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(speculate=tiny(7, 1)), InputError, "the draft model's vocabulary has 7 tokens"),
    (dict(speculate="ngram", draft_tokens=0), InputError, "draft_tokens must be an integer >= 1"),
    (dict(speculate="ngram", use_cache=False), InputError, "cannot run without it"),
    (dict(speculate="medusa"), InputError, "speculate must be 'ngram', a draft model or a drafter"),
    (dict(speculate=3), InputError, "speculate must be 'ngram', a draft model or a drafter"),
    (dict(speculate=NGramDrafter), InputError, r"speculate got the class NGramDrafter: give an instance"),
])
def test_bad_speculation_is_refused_before_any_work(kwargs, error, message):
    with pytest.raises(error, match=message):
        minigpt.generate(tiny(6, 0), [1, 2], 5, **kwargs)


def test_a_draft_model_whose_context_is_too_short_is_refused():
    config = GPT2Config(vocab_size=6, n_positions=8, n_embd=8, n_layer=1, n_head=1, eos_token_id=None)
    with pytest.raises(ContextLengthError, match="the draft model's context holds 8"):
        minigpt.generate(tiny(6, 0), [1, 2], 20, speculate=Model(config, random_params(config)))


class FixedDrafter:
    """Proposes whatever `proposal(k)` makes of the k it is asked for: a drafter of one's own."""

    def __init__(self, proposal):
        self.proposal = proposal

    def propose(self, ids, k, options, rng):
        return self.proposal(k)

    def accepted(self, n_positions):
        pass


@pytest.mark.parametrize("proposal, fault", [
    (lambda k: None, "returned NoneType None"),
    (lambda k: [1] * k, "returned list [1, 1, 1, 1]"),  # drafts without q
    (lambda k: ([1] * k, None, 0), "returned tuple"),
    (lambda k: ([1] * (k + 1), None), "5 drafts where 4 were asked for"),
    (lambda k: ([1] * 1000, None), "1000 drafts where 4 were asked for"),
    (lambda k: ([6] * k, None), "token id 6 at index 0 is outside [0, 6)"),
    (lambda k: ([1.0] * k, None), "token id at index 0 is 1.0, not an integer"),
    (lambda k: ("ab", None), "got the text 'ab'"),
    (lambda k: ([1] * k, np.full((k + 1, 6), 1 / 6)), "q of shape [5, 6] for 4 drafts"),
    (lambda k: ([1] * k, np.full(6, 1 / 6)), "q of shape [6] for 4 drafts"),
    (lambda k: ([1] * k, np.zeros((k, 6))), "a q whose row 0 sums to 0, not 1"),  # would accept every draft
    (lambda k: ([1] * k, np.full((k, 6), 0.5)), "a q whose row 0 sums to 3, not 1"),
    (lambda k: ([1] * k, np.full((k, 6), np.nan)), "a q with negative, NaN or infinite probabilities"),
    (lambda k: ([1] * k, np.eye(6)[[1] * k] * 2 - np.eye(6)[[2] * k]), "negative, NaN or infinite"),
    (lambda k: ([0] * k, np.eye(6)[[1] * k]), "draft 0 (0) with probability 0 in its row of q"),
    (lambda k: ([1] * k, "q"), "a q that is no array of real numbers (str of <U1)"),
    (lambda k: ([1] * k, np.full((k, 6), 1 / 6) + 1j), "no array of real numbers (ndarray of complex128)"),
    (lambda k: ([1] * k, [[0.5, 0.5], [1.0]] * 2), "a q that is no array of numbers (list)"),
])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_drafter_that_breaks_its_contract_is_named_with_what_it_returned(proposal, fault, temperature):
    with pytest.raises(DrafterError) as caught:
        minigpt.generate(tiny(6, 0), [1, 2, 3], 6, speculate=FixedDrafter(proposal), temperature=temperature,
                         seed=0)
    assert isinstance(caught.value, InputError)  # a MinigptError: the CLI and callers catch it as one
    assert str(caught.value).startswith("the drafter FixedDrafter's propose returned ") and fault in str(caught.value)


def test_a_drafter_may_return_a_numpy_array_of_drafts_and_fewer_than_asked():
    model = tiny(6, 0)
    expected = minigpt.generate(model, [1, 2, 3], 8, speculate=FixedDrafter(lambda k: ([1] * k, None)))
    for proposal in (lambda k: (np.ones(k, np.int32), None), lambda k: ([1] * k, np.eye(6)[[1] * k])):
        assert minigpt.generate(model, [1, 2, 3], 8, speculate=FixedDrafter(proposal)).tokens == expected.tokens
    assert minigpt.generate(model, [1, 2, 3], 8, speculate=FixedDrafter(lambda k: ([], None))).drafted == 0


# --------------------------------------------------------------------------- counts and k


def test_the_model_as_its_own_draft_is_always_accepted_and_counts_say_so():
    model = tiny(6, 0)
    result = minigpt.generate(model, [1, 2, 3], 20, speculate=model, draft_tokens=4)
    assert result.drafted == result.accepted > 0
    assert result.tokens == minigpt.generate(model, [1, 2, 3], 20).tokens


class WrongDrafter:
    """Always proposes a token the model does not choose; counts its proposals."""

    def __init__(self, model):
        self.model, self.proposals = model, []

    def propose(self, ids, k, options, rng):
        wrong = (int(np.argmax(self.model.forward(ids)[-1])) + 1) % self.model.config.vocab_size
        self.proposals.append(k)
        return [wrong] * k, None

    def accepted(self, n_positions):
        pass


def test_an_always_wrong_drafter_is_tried_less_and_less():
    """k shrinks by one per rejection to 0, then single drafts are retried after 2, 4, 8, ... plain steps."""
    model = tiny(6, 0)
    drafter = WrongDrafter(model)
    result = minigpt.generate(model, [1, 2, 3], 28, speculate=drafter, draft_tokens=3)
    assert result.accepted == 0 and result.tokens == minigpt.generate(model, [1, 2, 3], 28).tokens
    assert drafter.proposals[:3] == [3, 2, 1]
    assert len(drafter.proposals) == 3 + 3  # retries after 2, 4 and 8 plain steps within 28 tokens


# --------------------------------------------------------------------------- sampling is exact


def first_tokens(p, q, drafts_from, n=20_000, seed=0):
    """Counts of the first and (after an accepted first draft) second token of n verifications of
    rows whose sampling distributions are p [k+1, vocab] (logits log p, temperature 1)."""
    rng = np.random.default_rng(seed)
    logits = np.where(p > 0, np.log(np.where(p > 0, p, 1)), -1e30).astype(np.float32)  # -1e30: probability 0
    request = Request((0,), len(p), SamplingOptions(temperature=1.0), None)
    first, second = np.zeros(p.shape[1], int), np.zeros(p.shape[1], int)
    for _ in range(n):
        seq = Sequence(request)
        seq.rng = rng
        verify(seq, logits, drafts_from(rng), q, 0.0)
        first[seq.tokens[0]] += 1
        if len(seq.tokens) > 1:
            second[seq.tokens[1]] += 1
    return first, second


def distributions(seed, vocab=6, k=2):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(vocab), k + 1), rng.dirichlet(np.ones(vocab) * 0.5, k)
    p[:, 0] = 0  # a token the model never samples (top-k/top-p filtered): a draft of it must be rejected
    p /= p.sum(axis=1, keepdims=True)
    return p, q


def test_speculative_sampling_tokens_follow_the_models_distribution_with_a_model_drafter():
    p, q = distributions(1)
    first, second = first_tokens(p, q, lambda rng: [int(rng.choice(6, p=row)) for row in q])
    assert not chi_square_rejects(first, p[0])
    assert not chi_square_rejects(second, p[1])


def test_speculative_sampling_tokens_follow_the_models_distribution_with_one_hot_drafts():
    p, _ = distributions(2)
    first, second = first_tokens(p, None, lambda rng: [3, 0])
    assert not chi_square_rejects(first, p[0])
    assert not chi_square_rejects(second, p[1])


@pytest.mark.parametrize("wrong", [
    lambda p, q: np.maximum(q - p, 0) / np.maximum(q - p, 0).sum(),  # q and p swapped
    lambda p, q: q / q.sum(),  # q used where p belongs
    lambda p, q: p / p.sum(),  # the draft's share not taken out
])
def test_the_statistical_test_catches_a_wrong_residual_distribution(monkeypatch, wrong):
    monkeypatch.setattr(speculative, "residual", wrong)
    p, q = distributions(1)
    first, _ = first_tokens(p, q, lambda rng: [int(rng.choice(6, p=row)) for row in q])
    assert chi_square_rejects(first, p[0])


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_sampled_speculative_generation_draws_the_first_token_from_the_models_filtered_distribution(drafter):
    """End to end: the first new token of 1,500 seeded runs, against p after temperature and top-k."""
    model, prompt = tiny(6, 0), [1, 2, 3, 1, 2]
    options = dict(temperature=1.5, top_k=4)
    speculate = "ngram" if drafter == "ngram" else tiny(6, 5)
    p = np.exp(filtered_log_probs(model.forward(prompt)[-1], SamplingOptions(**options)))
    counts = np.zeros(6, int)
    drafted = 0
    for seed in range(1500):
        result = minigpt.generate(model, prompt, 2, speculate=speculate, draft_tokens=1, seed=seed, **options)
        counts[result.tokens[0]] += 1
        drafted += result.drafted
    assert drafted > 0
    assert not chi_square_rejects(counts, p)


def overflowing_token_model(model, token):
    """model with `token`'s embedding so large (1e37) that the forward overflows where it is fed, and
    a final LayerNorm whose output is a constant summing to 0: `token`'s logit is exactly 0, so
    greedy decoding never chooses it."""
    from minigpt.loading.weights import params_from_tensors, params_to_tensors
    C = model.config.n_embd
    t = params_to_tensors(model.params)
    t["ln_f.weight"] = np.zeros(C, np.float32)
    t["ln_f.bias"] = np.tile(np.float32([1, -1]), C // 2)  # sums to exactly 0: a logit is 0 for a constant row
    wte = t["wte.weight"].copy()
    wte[token] = 1e37
    t["wte.weight"] = wte
    return Model(model.config, params_from_tensors(model.config, t))


class Always:
    """A drafter of one's own that always proposes the same token."""

    def __init__(self, token):
        self.token = token

    def propose(self, ids, k, options, rng):
        return [self.token] * k, None

    def accepted(self, n_positions):
        pass


def test_a_draft_whose_position_overflows_is_rejected_as_plain_decoding_never_feeds_it(tiny_model):
    """A drafted token that overflows the model, and that greedy decoding never chooses: speculation
    verifies the drafts before it and gives plain decoding's tokens, instead of an error plain
    decoding never meets. A draft model that overflows drafts fewer tokens, not an error."""
    import dataclasses
    from minigpt.loading.weights import params_from_tensors, params_to_tensors
    tiny = tiny_model
    x = 31337
    main = overflowing_token_model(tiny, x)
    prompt = [464, 3290, 318]
    with np.errstate(over="ignore", invalid="ignore"):
        plain = minigpt.generate(main, prompt, 8, stop_at_eos=False)
        assert x not in plain.tokens
        drafted = minigpt.generate(main, prompt, 8, stop_at_eos=False, speculate=Always(x))
        t = {n: v * np.float32(1e30) if n.startswith("h.1.") else v for n, v in params_to_tensors(tiny.params).items()}
        huge_draft = dataclasses.replace(tiny, params=params_from_tensors(tiny.config, t))
        by_huge_draft = minigpt.generate(main, prompt, 8, stop_at_eos=False, speculate=huge_draft)
    assert drafted.tokens == plain.tokens and by_huge_draft.tokens == plain.tokens
    assert drafted.logprobs == plain.logprobs
