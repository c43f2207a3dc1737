"""minigpt.Engine: the prefix cache hits where it should, requests that arrive together compute a
shared prefix once, cached pages are evicted before running sequences are preempted, a cancelled
request gives its pages back, and scoring-only requests score."""

from __future__ import annotations

import subprocess
import sys

import pytest

import minigpt
from requesting import new_request, submitted
from minigpt.errors import InputError

PREFIX = list(range(1000, 1048))  # three full pages


def test_a_warm_prompt_takes_its_full_pages_before_its_last_token_from_the_cache(tiny_model):
    engine = minigpt.Engine(tiny_model)
    cold = engine.generate([PREFIX + [5, 6]], 4)[0]
    warm = engine.generate([PREFIX + [5, 6], PREFIX[:40], PREFIX], 4)
    assert cold.cached_tokens == 0
    assert [r.cached_tokens for r in warm] == [48, 32, 32]  # the last id is always fed: PREFIX hits 2 pages
    assert warm[0].tokens == cold.tokens and warm[0].logprobs == cold.logprobs


def test_generated_pages_are_cached_so_a_follow_up_hits_them(tiny_model):
    engine = minigpt.Engine(tiny_model)
    first = engine.generate([PREFIX[:10]], 30, stop_at_eos=False)[0]
    follow_up = engine.generate([PREFIX[:10] + first.tokens + [7]], 2)[0]
    assert follow_up.cached_tokens == 32  # positions 0 .. 31 were written by the first request


def test_requests_arriving_together_compute_a_shared_prefix_once(tiny_model):
    engine = minigpt.Engine(tiny_model, max_batch_size=8)
    results = engine.generate([PREFIX + [i] for i in range(4)], 2)
    assert [r.cached_tokens for r in results] == [0, 48, 48, 48]
    assert engine.stats()["cached_token_hits"] == 3 * 48


def test_cached_pages_are_evicted_before_a_running_sequence_is_preempted(tiny_model):
    engine = minigpt.Engine(tiny_model, max_batch_size=1, kv_cache_tokens=64)  # 4 pages
    engine.generate([PREFIX], 1)  # leaves its 3 full pages cached
    assert engine.stats()["pages_cached"] == 3
    engine.generate([list(range(50))], 14, stop_at_eos=False)  # 63 positions: every page
    stats = engine.stats()
    assert stats["evictions"] == 3 and stats["preemptions"] == 0


def test_a_preempted_sequence_holds_nothing_and_gets_its_tokens_alone(tiny_model):
    """Preempted, a sequence gives back its pages and forgets its place in the prefix cache (its
    written pages stay cached for anyone, itself included); readmitted, it starts from nothing."""
    prompts = [PREFIX + [i] for i in range(3)]
    engine = minigpt.Engine(tiny_model, max_batch_size=3, kv_cache_tokens=160)  # 10 pages for 3 x 7 needed
    jobs = [submitted(engine, new_request(tiny_model, prompt, 60, stop_at_eos=False)) for prompt in prompts]
    while engine.stats()["preemptions"] == 0:
        engine.step()
    victims = [job for job in jobs if job.preemptions]
    assert victims and all(job.cache.pages == [] and job.hashes == [] for job in victims)
    while engine.pending():
        engine.step()
    for prompt, job in zip(prompts, jobs):
        alone = minigpt.generate(tiny_model, prompt, 60, stop_at_eos=False)
        result = job.result()
        assert result.tokens == alone.tokens and result.logprobs == alone.logprobs


def test_a_cancelled_request_leaves_and_gives_its_pages_back(tiny_model):
    engine = minigpt.Engine(tiny_model, prefix_cache=False)
    job = submitted(engine, new_request(tiny_model, PREFIX, 100, stop_at_eos=False))
    engine.step()
    assert engine.stats()["pages_in_use"] == 3  # the prompt's 48 positions
    engine.cancel(job)
    finished, _ = engine.step()
    assert finished == [job] and engine.stats()["pages_in_use"] == 0 and engine.stats()["pages_free"] == 16 * 16


def test_scoring_only_gives_prompt_logprobs_and_no_tokens(tiny_model):
    result = minigpt.Engine(tiny_model).generate([PREFIX], 0, prompt_logprobs=True, top_logprobs=2)[0]
    assert result.tokens == [] and result.finish_reason == "length"
    assert result.prompt_logprobs[0] is None
    assert result.prompt_logprobs[1:] == minigpt.score(tiny_model, PREFIX).tolist()
    assert len(result.prompt_top_logprobs) == len(PREFIX) and len(result.prompt_top_logprobs[1]) == 2


@pytest.mark.parametrize("options, message", [
    (dict(max_batch_size=0), "max_batch_size must be an integer >= 1"),
    (dict(kv_cache_tokens=0), "kv_cache_tokens must be an integer >= 1"),
    (dict(prefix_cache="yes"), "prefix_cache must be True or False"),
])
def test_engine_options_are_checked(tiny_model, options, message):
    with pytest.raises(InputError, match=message):
        minigpt.Engine(tiny_model, **options)


PEAK_RSS = """
import resource, sys, minigpt
model = minigpt.load("random-124m")
minigpt.generate_batch(model, [[464, 3290 + i] for i in range(int(sys.argv[1]))], 4)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_sixteen_short_prompts_peak_within_1_2x_the_memory_of_one():
    """The pool (16 whole contexts of GPT-2 small: 1.2 GB reserved) commits memory only as pages are
    written, so 16 two-token prompts cost about what one does (peak RSS of a fresh process each)."""
    peaks = [int(subprocess.run([sys.executable, "-c", PEAK_RSS, str(n)], capture_output=True, text=True,
                                check=True, timeout=120).stdout) for n in (1, 16)]
    assert peaks[1] <= 1.2 * peaks[0], peaks


def test_a_call_gets_the_results_of_its_own_requests_only(tiny_model):
    """A request submitted to the Engine by hand runs alongside a later generate call, to its end,
    but the call returns its own prompts' results, each as generated alone."""
    a, b = [464, 3290, 318], [1000, 1001, 1002, 1003]
    engine = minigpt.Engine(tiny_model)
    other = submitted(engine, new_request(tiny_model, a, 30, stop_at_eos=False))
    got = engine.generate([b], 12, stop_at_eos=False)
    assert [r.prompt_ids for r in got] == [b]
    assert got[0].tokens == minigpt.generate(tiny_model, b, 12, stop_at_eos=False).tokens
    assert other.seq.done and other.result().tokens == minigpt.generate(tiny_model, a, 30, stop_at_eos=False).tokens


def test_a_request_that_can_never_fit_is_refused_before_it_is_queued_and_later_calls_still_run(tiny_model):
    engine = minigpt.Engine(tiny_model, kv_cache_tokens=32)  # 2 pages
    with pytest.raises(InputError, match="kv_cache_tokens"):
        submitted(engine, new_request(tiny_model, list(range(40)), 1))
    assert engine.generate([[1, 2]], 2)[0].tokens == minigpt.generate(tiny_model, [1, 2], 2).tokens


def test_a_second_thread_driving_an_engine_gets_engine_busy_and_the_first_gets_its_results(tiny_model):
    import threading

    engine, started, ready, job_results = minigpt.Engine(tiny_model), threading.Event(), threading.Event(), []

    def on_tokens(tokens):  # the first thread waits here, mid-run, while the test's thread tries to drive
        started.set()
        ready.wait(5)

    runner = threading.Thread(target=lambda: job_results.extend(
        r for _, r in engine.results(engine.jobs_for([new_request(tiny_model, PREFIX, 5, stop_at_eos=False)]), on_tokens)))
    runner.start()
    assert started.wait(5)
    for call in (lambda: engine.generate([[1, 2]], 2), engine.step, lambda: list(engine.run())):
        with pytest.raises(minigpt.errors.EngineBusyError, match="another thread"):
            call()
    ready.set()
    runner.join(10)
    expected = minigpt.generate(tiny_model, PREFIX, 5, stop_at_eos=False)
    assert [r.tokens for r in job_results] == [expected.tokens] and job_results[0].logprobs == expected.logprobs
    assert engine.generate([[1, 2]], 2)[0].tokens == minigpt.generate(tiny_model, [1, 2], 2).tokens  # free again


def test_a_call_from_inside_an_engine_s_own_run_gets_engine_busy(tiny_model):
    engine = minigpt.Engine(tiny_model)
    request = new_request(tiny_model, [1, 2, 3], 3, stop_at_eos=False)
    with pytest.raises(minigpt.errors.EngineBusyError, match="inside its own run"):
        list(engine.results(engine.jobs_for([request]), on_tokens=lambda tokens: engine.generate([[4, 5]], 1)))
    for _, result in engine.results(engine.jobs_for([request])):
        for call in (lambda: engine.generate([[4, 5]], 1), engine.step):
            with pytest.raises(minigpt.errors.EngineBusyError, match="inside its own run"):
                call()
    assert engine.generate([[1, 2]], 2)[0].tokens == minigpt.generate(tiny_model, [1, 2], 2).tokens


def test_a_job_cancelled_before_its_end_finishes_with_reason_abort(tiny_model):
    engine = minigpt.Engine(tiny_model)
    job = submitted(engine, new_request(tiny_model, [1, 2, 3], 50, stop_at_eos=False))
    engine.step()
    engine.cancel(job)
    finished, _ = engine.step()
    assert finished == [job] and job.result().finish_reason == "abort" and len(job.result().tokens) == 1


def test_the_weights_are_read_only_so_cached_pages_cannot_go_stale(tiny_model):
    params = tiny_model.params
    for array in (params.wte, params.wpe, params.h[0].attn.c_attn.weight, params.ln_f.bias):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1.0


def test_a_scored_page_taking_a_held_page_s_place_in_the_prefix_cache_leaves_it_held(tiny_model):
    """Job a (no prompt scores) has its prompt's first page in the prefix cache; job b, the same prompt
    with prompt_logprobs, computes that page again with its scores, and b's page takes its place in the
    cache. a's page leaves the cache but stays a's: never free while a holds it, so no other job is given
    it, and a's tokens are its own alone."""
    prompt = list(range(1, 25))  # one full page and part of another
    engine = minigpt.Engine(tiny_model)
    a = submitted(engine, new_request(tiny_model, prompt, 30, stop_at_eos=False))
    engine.step()  # a's prefill registers its first page, without scores
    first = a.cache.pages[0]
    b = submitted(engine, new_request(tiny_model, prompt, 20, stop_at_eos=False), prompt_logprobs=True)
    engine.step()  # b's prefill: the same page with its scores, registered in a's page's place
    assert b.cache.pages[0] != first and engine.pool.entries[b.cache.pages[0]].scores is not None
    assert first not in engine.pool.entries and not engine.pool.free[first]
    list(engine.run())
    alone = minigpt.generate(tiny_model, prompt, 30, stop_at_eos=False)
    assert (a.result().tokens, a.result().logprobs) == (alone.tokens, alone.logprobs)
