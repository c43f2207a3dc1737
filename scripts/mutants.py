"""The tests, tested: plausible bugs put into a copy of the repository one at a time, each of which
the tests that guard its claim must catch (docs/testing.md says which test guards which claim).

    PYTHONPATH=. python scripts/mutants.py             # every bug: caught or survived, seconds to fail
    PYTHONPATH=. python scripts/mutants.py --list      # the table of bugs and their guards, no run
    PYTHONPATH=. python scripts/mutants.py --only gelu-constant prefix-hash-parent

Each bug is a snippet of one file and its replacement (a bug may need a few), applied in a
temporary copy of the working tree (what git tracks or would), never in the checkout; only its
guarding tests run there (pytest -x; Hypothesis' "ci" examples without shrinking). A bug is caught
only by a failing test, never by an error collecting them. A snippet that no longer matches its file exactly once
stops the run before any test: the code moved, and the bug must be written again. Exit status 0
only if every bug was caught.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECONDS = 600  # a bug whose tests run longer is reported as a hang (caught: something never ended)


@dataclass(frozen=True)
class Mutant:
    name: str
    claim: str  # what the bug breaks, as the book states it
    edits: tuple[tuple[str, str, str], ...]  # (file, snippet, replacement)
    tests: tuple[str, ...]  # the tests that must catch it


def bug(name: str, claim: str, file: str, snippet: str, replacement: str, *tests: str,
        more: tuple[tuple[str, str, str], ...] = ()) -> Mutant:
    return Mutant(name, claim, ((file, snippet, replacement), *more), tests)


LAYERS, SAMPLING = "minigpt/gpt2/layers.py", "minigpt/loop/sampling.py"
REFERENCES = "tests/properties/test_references.py"
MACHINE = "tests/properties/test_engine_machine.py"
MUTANTS = [
    # part 1: GPT-2 plainly
    bug("gelu-constant", "GELU is GPT-2's tanh approximation", LAYERS,
        "t = 0.044715 * x * x", "t = 0.0447 * x * x", f"{REFERENCES}::test_gelu_is_within_4_float32_ulps_of_x_of_the_float64_tanh_formula"),
    bug("layer-norm-unbiased-variance", "LayerNorm divides by the biased variance, as torch", LAYERS,
        "var = (centered * centered).sum(axis=-1, keepdims=True) / n", "var = (centered * centered).sum(axis=-1, keepdims=True) / (n - 1)",
        f"{REFERENCES}::test_layer_norm_is_within_4_float32_roundings_of_the_float64_formula"),
    bug("layer-norm-eps-outside-sqrt", "LayerNorm adds eps inside the square root", LAYERS,
        "np.sqrt(var + eps)", "(np.sqrt(var) + eps)", f"{REFERENCES}::test_layer_norm_is_within_4_float32_roundings_of_the_float64_formula"),
    bug("mask-sees-the-next-key", "the causal mask hides every later key", LAYERS,
        "where=np.arange(S) > np.arange(S - T, S)[:, None]", "where=np.arange(S) > np.arange(S - T, S)[:, None] + 1",
        f"{REFERENCES}::test_attention_softmax_is_within_8_float32_roundings_of_the_float64_formula", "tests/gpt2/test_layers.py"),
    bug("attention-scale-by-head-count", "scores are divided by sqrt(head_dim)", LAYERS,
        "scores /= np.float32(math.sqrt(q.shape[-1]))", "scores /= np.float32(math.sqrt(q.shape[0]))",
        f"{REFERENCES}::test_attention_softmax_is_within_8_float32_roundings_of_the_float64_formula"),
    bug("position-embedding-off-by-one", "position t takes wpe[t]", "minigpt/gpt2/forward.py",
        "x = embed(gpt.params, ids)  # [T, C]", "x = embed(gpt.params, ids, 1)  # [T, C]", "tests/gpt2/test_parity.py"),
    # part 2: the KV cache
    bug("cache-positions-off-by-one", "a cached forward continues at the cache's length", "minigpt/cache/kv_cache.py",
        "x = embed(gpt.params, ids, start)  # NEW", "x = embed(gpt.params, ids, max(start - 1, 0))  # NEW",
        "tests/properties/test_cache_exactness.py::test_forward_cached_in_any_chunks_is_bitwise_part_1_s_forward_and_appending_changes_no_old_row"),
    # part 3: sampling and stopping
    bug("log-softmax-float32-sum", "log-probabilities sum the normaliser in float64", SAMPLING,
        "np.exp(logits - top).sum(dtype=np.float64)", "np.exp(logits - top).sum(dtype=np.float32)",
        f"{REFERENCES}::test_log_probabilities_are_within_half_a_float32_rounding_of_an_exact_fsum_reference"),
    bug("temperature-after-filtering", "temperature is applied before top-k and top-p", SAMPLING,
        "z = (z - z.max()) / options.temperature", "z = z - z.max()",
        f"{REFERENCES}::test_temperature_top_k_and_top_p_keep_exactly_the_tokens_transformers_keeps_with_its_probabilities",
        more=((SAMPLING, "    z -= z.max()\n    return z - np.log(np.exp(z).sum())",
               "    z = z / options.temperature\n    z -= z.max()\n    return z - np.log(np.exp(z).sum())"),)),
    bug("top-k-drops-ties", "top-k keeps every token tied with the k-th, as Hugging Face", SAMPLING,
        "z[z < kth] = -np.inf", "z[z <= kth] = -np.inf", f"{REFERENCES}::test_temperature_top_k_and_top_p_keep_exactly_the_tokens_transformers_keeps_with_its_probabilities"),
    bug("top-p-one-token-short", "top-p keeps the smallest set holding top_p", SAMPLING,
        "z[order[mass_before >= options.top_p]] = -np.inf", "z[order[mass_before + p >= options.top_p]] = -np.inf",
        f"{REFERENCES}::test_temperature_top_k_and_top_p_keep_exactly_the_tokens_transformers_keeps_with_its_probabilities"),
    bug("greedy-argmin", "temperature 0 takes the most likely token", SAMPLING,
        "return int(np.argmax(logits))", "return int(np.argmax(logits[:-1]))", "tests/loop/test_sampling.py", "tests/loop/test_parity_text.py"),
    bug("stop-string-later-match", "the text ends before the first stop string to begin", "minigpt/loop/stops.py",
        "first = start if first is None else min(first, start)", "first = start if first is None else max(first, start)",
        "tests/properties/test_stop_strings.py", "tests/loop/test_sequence.py"),
    bug("presence-penalty-added", "the presence penalty is subtracted from a seen token's logit (OpenAI's formula)",
        "minigpt/loop/processing.py", "np.array(self.counts, np.float64) - p.presence",
        "np.array(self.counts, np.float64) + p.presence", "tests/properties/test_logits_processing.py"),
    bug("repetition-penalty-skips-the-prompt", "the repetition penalty covers the prompt's tokens (Hugging Face's, vLLM's)",
        "minigpt/loop/processing.py", "self.seen_set = set(prompt)", "self.seen_set = set()",
        "tests/properties/test_logits_processing.py"),
    bug("processed-logprob-reported", "the log-probabilities reported are the raw row's, whatever the processing",
        "minigpt/loop/sequence.py", "self.logprobs.append(token_log_prob(logits, token))",
        "self.logprobs.append(token_log_prob(self.processed(logits).astype(np.float32), token))",
        "tests/properties/test_logits_processing.py"),
    # part 4: exactness
    bug("gemv-calls-not-aligned", "every gemv call computes a multiple of 16 x threads outputs",
        "minigpt/exact/threads.py",
        "return math.lcm(ALIGN, 16 * threads())", "return 1", "tests/exact/test_threads.py"),
    bug("gemv-call-past-the-small-kernel", "no gemv call is larger than OpenBLAS's small-input SkylakeX kernel takes",
        "minigpt/exact/linear.py", "MAX_CALL = 16384", "MAX_CALL = 10**9", "tests/gpt2/test_layers.py"),
    bug("head-block-copied-into-gemv-n", "several rows read the head's wte.T in place, as one row does (gemv T)",
        "minigpt/exact/linear.py", "if T < COPY_ROWS or _columns(weight):", "if T < COPY_ROWS:",
        "tests/testing/test_testing.py", "tests/properties/test_batch_exactness.py"),
    bug("tile-tree-halves-unpadded", "tiles are added up by one fixed tree, whatever the batch", "minigpt/exact/attention.py",
        "        half //= 2\n", "        half = (n + 1) // 2\n",
        "tests/gpt2/test_layers.py", "tests/properties/test_batch_exactness.py"),
    bug("exact-attention-without-headroom", "exact attention's undivided sums keep headroom", "minigpt/exact/attention.py",
        "scores -= np.maximum.reduce(scores, axis=-1, keepdims=True) + HEADROOM",
        "scores -= np.maximum.reduce(scores, axis=-1, keepdims=True)", "tests/gpt2/test_layers.py"),
    # part 5: loading and checking
    bug("weights-copied-not-mapped", "float32 weights are the file's bytes, mapped, not copied",
        "minigpt/loading/safetensors_format.py", "    return raw\n", "    return raw.copy()\n",
        "tests/loading/test_checkpoint.py", "tests/loading/test_safetensors_format.py"),
    bug("map-writeable", "nothing is written through the map", "minigpt/loading/safetensors_format.py",
        "access=mmap.ACCESS_READ", "access=mmap.ACCESS_COPY", "tests/loading/test_checkpoint.py", "tests/loading/test_safetensors_format.py"),
    bug("safetensors-gap-accepted", "tensors tile the data buffer with no gap", "minigpt/loading/safetensors_format.py",
        "        if begin != end:\n", "        if begin < end:\n", "tests/loading/test_safetensors_format.py", "tests/loading/test_hostile_checkpoints.py"),
    bug("endoftext-as-text", "<|endoftext|> in a text is the special token, as OpenAI and vLLM encode it",
        "minigpt/loading/tokenizer.py", "documents = text.split(ENDOFTEXT) if special_tokens else [text]",
        "documents = [text]", "tests/loading/test_tokenizer.py"),
    # part 6: requests
    bug("grammar-mask-not-applied", "a constrained sequence takes only tokens its grammar allows",
        "minigpt/requests/structured.py", "np.putmask(z, ~self.allowed(), -np.inf)", "pass",
        "tests/properties/test_structured_exactness.py", "tests/requests/test_structured_generation.py"),
    bug("grammar-eos-without-stop-at-eos", "without stop_at_eos a grammar never allows <|endoftext|>",
        "minigpt/requests/structured.py", "        if always or not self.eos_allowed:", "        if always:",
        "tests/requests/test_structured.py", "tests/requests/test_structured_generation.py"),
    bug("repetitions-not-multiplied", "a constraint's nested counted repetitions are bounded as their product",
        "minigpt/requests/structured.py", "last = min(last * int(count[:31]), 10**30)", "last = min(int(count[:31]), 10**30)",
        "tests/requests/test_constraint_limits.py"),
    bug("choice-as-a-regex-unescaped", "a choice's strings are literal text", "minigpt/requests/structured.py",
        'return "|".join(choice.translate(LITERAL) for choice in value)', 'return "|".join(value)',
        "tests/requests/test_constraint_limits.py"),
    bug("schema-true-not-any-json", "a JSON schema of true is any JSON", "minigpt/requests/structured.py",
        "return {} if value is True else value", "return value", "tests/requests/test_constraint_limits.py"),
    bug("json-free-whitespace", "constrained JSON is laid out as json.dumps lays it out", "minigpt/requests/structured.py",
        'JSON_LAYOUT = {"whitespace_flexible": False,', 'JSON_LAYOUT = {"whitespace_flexible": True,',
        "tests/requests/test_structured.py"),
    bug("repetition-penalty-unbounded", "no value the controls' checks accept makes a logit infinite or NaN",
        "minigpt/requests/request.py", "number(lambda v: MIN_REPETITION_PENALTY <= v <= MAX_REPETITION_PENALTY",
        "number(lambda v: 0 < v < math.inf", "tests/properties/test_controls_finite.py", "tests/loading/test_numerical_failures.py"),
    bug("logit-bias-same-token-twice", "logit_bias has one key per token (\"05\" and \"5\" are one token)",
        "minigpt/requests/token_keys.py", "        if token in named:\n", "        if False:\n",
        "tests/requests/test_logit_bias_keys.py"),
    # part 7: the engine
    bug("prefix-hash-parent", "a cached page is reused only under the same whole prefix", "minigpt/engine/paging.py",
        "        parent = page_hash(parent, page_tokens(ids, i))", "        parent = page_hash(b\"\", page_tokens(ids, i))",
        "tests/properties/test_prefix_cache_exactness.py::test_the_prefix_cache_reuses_a_page_only_under_the_same_whole_prefix"),
    bug("preempted-keeps-its-hashes", "a preempted sequence starts again from nothing", "minigpt/engine/scheduler.py",
        "        self.pool.release(job.cache)\n        job.hashes = []\n", "        self.pool.release(job.cache)\n",
        "tests/engine/test_engine.py", "tests/properties/test_engine_exactness.py", "tests/properties/test_prefix_cache_exactness.py"),
    bug("preempt-the-oldest", "the newest running sequence is preempted first", "minigpt/engine/scheduler.py",
        "victim = self.running.pop()", "victim = self.running.pop(0)", "tests/engine/test_batching.py", "tests/engine/test_engine.py"),
    bug("forget-frees-a-held-page", "a page is given back once, when its last holder lets go", "minigpt/engine/paging.py",
        "        if self.cached.pop(page, False) is None:\n            self.free[page] = True",
        "        self.cached.pop(page, None)\n        self.free[page] = True",
        "tests/engine/test_engine.py::test_a_scored_page_taking_a_held_page_s_place_in_the_prefix_cache_leaves_it_held",
        MACHINE),
    bug("cancel-only-running", "a cancelled job leaves at the next step, waiting or running, its pages dropped",
        "minigpt/engine/scheduler.py", "finished = [job for job in [*self.waiting, *self.running] if job.finished]",
        "finished = [job for job in self.running if job.finished]", MACHINE),
    bug("unadmitted-keeps-cached-pages", "a job that cannot be admitted lets go of the cached pages it took, so that "
        "its next admission takes each once", "minigpt/engine/scheduler.py",
        "            if not self.pool.grow(job.cache, len(ids)):\n                self._release(job)\n",
        "            if not self.pool.grow(job.cache, len(ids)):\n", MACHINE,
        "tests/engine/test_engine.py::test_a_preempted_sequence_holds_nothing_and_gets_its_tokens_alone"),
    bug("every-page-of-the-prompt-cached", "however much of a prompt is cached, its last id is fed",
        "minigpt/engine/scheduler.py", "chained_hashes(self.root, ids, 0, (len(ids) - 1) // PAGE)",
        "chained_hashes(self.root, ids, 0, len(ids) // PAGE)", MACHINE,
        "tests/engine/test_engine.py::test_a_warm_prompt_takes_its_full_pages_before_its_last_token_from_the_cache"),
    bug("speculative-accept-always", "a draft is accepted with probability min(1, p/q)", "minigpt/engine/speculative.py",
        "if rng.random() * q[draft] < p[draft]:", "if rng.random() * q[draft] <= q[draft]:",
        "tests/engine/test_speculative.py"),
    bug("speculative-keeps-rejected-keys", "the cache is cut back past the rejected drafts", "minigpt/engine/speculative.py",
        "cache.truncate(len(ids) + n_accepted)", "cache.truncate(len(ids) + n_accepted + 1)",
        "tests/properties/test_speculative_exactness.py", "tests/engine/test_speculative.py"),
    bug("masks-in-the-step", "a costly mask holds up its own sequence only, never the batch", "minigpt/engine/masks.py",
        "        if jobs and all(job in self.preparing for job in jobs):\n"
        "            wait(self.preparing.values(), MASK_WAIT_SECONDS, FIRST_COMPLETED)\n",
        "        if self.preparing:\n            wait(self.preparing.values())\n",
        "tests/requests/test_constraint_limits.py::test_a_slow_constraint_holds_up_its_own_sequence_only"),
    bug("engine-takes-another-thread", "one engine is driven from one thread at a time", "minigpt/engine/engine.py",
        "            if not mine and self._driver is not None:", "            if False:",
        "tests/engine/test_engine.py"),
    bug("overflow-fails-the-batch", "a sequence whose weights overflow fails alone, the batch goes on",
        "minigpt/engine/engine.py", "except (InputError, NumericalError) as e:", "except InputError as e:",
        "tests/loading/test_numerical_failures.py"),
    # parts 8-10: the Python API, the server, the command line
    bug("preparation-outlives-the-stop", "a request still being prepared at SIGTERM is answered 503 after the grace period",
        "minigpt/server/engine_thread.py", "await asyncio.wait([done, stop], return_when=asyncio.FIRST_COMPLETED)",
        "await asyncio.wait([done])", "tests/server/test_serve_shutdown.py"),
    bug("grammar-complete-goes-on", "a text that matches its grammar whole ends there, finish_reason stop",
        "minigpt/loop/sequence.py", 'self.finish_reason = "stop"  # the text matches its grammar whole: nothing may follow',
        "pass", "tests/properties/test_structured_exactness.py", "tests/requests/test_structured_generation.py"),
    bug("score-windows-skip-a-token", "scoring windows cover every token once", "minigpt/api/scoring.py",
        "first, last = last + 1, min(last + stride, ids.size - 1)", "first, last = last + 2, min(last + stride, ids.size - 1)",
        "tests/api/test_scoring.py"),
    bug("server-seeds-repeat", "choice j of a request samples with seed + j", "minigpt/server/completion_request.py",
        "sampling=dataclasses.replace(request.sampling, seed=self.seed + j)",
        "sampling=dataclasses.replace(request.sampling, seed=self.seed)", "tests/server/test_serve.py"),
    bug("usage-counts-prompt-per-choice", "usage counts each prompt once", "minigpt/server/completion_response.py",
        "firsts = results[::request.best_of]", "firsts = results", "tests/server/test_serve.py"),
    bug("metrics-count-tokens-again", "/metrics counts each choice's prompt and tokens once",
        "minigpt/server/engine_thread.py", "ticket.counted, ticket.last = len(job.seq.tokens), now", "ticket.last = now",
        "tests/server/test_serve_machine.py"),
    bug("kept-tuning-key-twice", "a kept tuning with a key twice is refused, not read as its last", "minigpt/exact/tuning.py",
        "kept = json.loads(data, object_pairs_hook=unique_keys)", "kept = json.loads(data)",
        "tests/exact/test_tuning.py"),
    bug("metrics-prompt-at-first-token", "/metrics counts every prefilled prompt token, none made or not",
        "minigpt/server/engine_thread.py", "(job.prefilled or made > 0)", "made > 0", "tests/server/test_metrics_prompts.py"),
    bug("inspect-without-its-turn", "/inspect computes one request at a time", "minigpt/server/page.py",
        "    with turn:\n        return function(*args)", "    return function(*args)",
        "tests/server/test_inspect_bounds.py::test_the_server_s_inspect_computes_one_request_at_a_time_and_answers_a_429_beyond_those_it_holds"),
    bug("page-generates-twice", "the page runs one generation at a time, whatever the key", "minigpt/server/page/page.js",
        "  if (state.running) return;", "", "tests/server/test_page_prompts.py::test_ctrl_enter_during_a_generation_starts_no_second_one"),
    # the commands
    bug("picture-part-left-behind", "a picture is written whole or not at all", "minigpt/cli/pictures.py",
        "            os.unlink(part)", "            pass", "tests/cli/test_pictures_whole.py"),
]


def check_snippets(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """Every edit's snippet as it stands: the faults of those that do not occur exactly once."""
    faults = []
    for m in mutants:
        for file, snippet, _ in m.edits:
            count = (root / file).read_text().count(snippet)
            if count != 1:
                faults.append(f"{m.name}: {file} holds its snippet {count} times: {snippet.strip()[:60]!r}")
    return faults


def working_copy(into: Path) -> None:
    """The working tree's files that git tracks or would (not those it ignores), copied into `into`."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout
    for name in files.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)


def run(mutant: Mutant, copy: Path) -> tuple[str, float, str]:
    """(verdict, seconds, the first failing test's line) for one bug, applied and then undone: caught
    only if a test failed (pytest's status 1); an error in collecting them (status 2 to 5: the copy
    lacks a file, a test moved) is no catch."""
    originals = {}
    for file, snippet, replacement in mutant.edits:
        path = copy / file
        originals.setdefault(path, path.read_text())
        path.write_text(path.read_text().replace(snippet, replacement))
    env = {**os.environ, "PYTHONPATH": str(copy), "HYPOTHESIS_PROFILE": "mutants", "PYTHONDONTWRITEBYTECODE": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutant.tests],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=SECONDS)
        failed = next((line for line in done.stdout.splitlines() if line.startswith("FAILED")), "")
        verdict = {0: "SURVIVED", 1: "caught"}.get(done.returncode, "ERROR")
        if done.returncode and not failed:
            failed = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    except subprocess.TimeoutExpired:
        verdict, failed = "caught", f"hung past {SECONDS} s"
    for path, text in originals.items():
        path.write_text(text)
    return verdict, time.perf_counter() - start, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the bugs and their guards, run nothing")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these bugs")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        print("| bug | claim | guarded by |\n|---|---|---|")
        for m in chosen:
            print(f"| {m.name} | {m.claim} | {', '.join(f'`{t}`' for t in m.tests)} |")
        return 0
    faults = check_snippets(chosen)
    if faults:
        print("\n".join(faults), file=sys.stderr)
        return 2
    survived = 0
    with tempfile.TemporaryDirectory(prefix="minigpt-mutants-") as tmp:
        copy = Path(tmp)
        working_copy(copy)
        print(f"{'bug':32} {'verdict':9} {'seconds':>8}  first failure")
        for m in chosen:
            verdict, seconds, failed = run(m, copy)
            survived += verdict != "caught"
            print(f"{m.name:32} {verdict:9} {seconds:8.1f}  {failed[:110]}", flush=True)
    print(f"{len(chosen) - survived} of {len(chosen)} caught")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
