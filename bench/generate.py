"""Every installed policy backend against transformers' `generate`: same prompts, same batch,
same new tokens, greedy.

One arm per backend (`policy.backend`, codeq/policy/backends.py; `--backends`, default every
one that can run here) and `generate`, on the same token ids:
  engine        `PolicyEngine.generate` (CodeQ's continuous batching; each distinct prompt read
                once and its KV kept once for all its samples)
  transformers  transformers' continuous batching (`TransformersPolicy`, over the same loaded
                model: paged cache, a request's samples forked from its prompt's blocks)
  vllm          vLLM (CUDA and the vllm extra only; its own copy of the model)
  generate      `model.generate` on the same ids, left-padded, greedy, the same stop tokens

Cases: batch sizes 1, 8, 32 (64 on CUDA) of distinct DebugBench repair prompts (~400-1500
tokens, built by CodeQ's own prompt builder; the builtin tasks when no DebugBench folder is
found), and K samples of a few prompts (`--siblings 4x8`: the generate arm gets each prompt K
times, as `num_return_sequences` would). The arms run in order, then in reverse order (ABBA:
engine, generate, generate, engine with two arms) so a machine that speeds up or slows down
weighs on all alike; medians are reported.

For each arm:
  tokens/s  generated tokens (each row up to and including its stop token) / wall time of the
            whole call, prompt reading included
  tokens/CPU-s  the same tokens / CPU time of the process during the call: on a CPU shared
            with other busy processes wall time also counts the time slices others took,
            CPU time mostly not (both are reported; with one torch thread it is the work done)
  TTFT      time to first token: wall time of the same call with max_new_tokens=1
  decode tokens/CPU-s  tokens after each row's first / (CPU time of the call - CPU time of
            the max_new_tokens=1 call): the decode steps alone, without the prompt reading
  peak MB   CUDA: torch.cuda.max_memory_allocated during the call (weights included). CPU: the
            process's resident-set high-water mark during the call (VmHWM, reset through
            /proc/self/clear_refs) minus the resident set before it, so the memory the call
            needed on top of the loaded weights

Parity: every case's outputs are compared token for token (texts and stop lengths). In float32
they must be equal (asserted for engine and transformers; vLLM's kernels are its own, so its
agreement is reported). In bf16 neither implementation is stable under a change of batch
composition (matmuls over 8 or 32 rows round differently from matmuls over 1), so the timed
bf16 runs report their agreement, and the same cases are asserted in float32 on their first
`--parity-rows` rows at the full token count, once per case, outside the timed runs.

The ratios backend / generate and the best backend of each case are printed last.

    python bench/generate.py                                # SmolLM2-135M
    python bench/generate.py --model /root/.cache/codeq/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    python bench/generate.py --batches 1 8 --siblings 4x8 --new-tokens 256 --json out.json
    python bench/generate.py --backends engine transformers   # a subset of the backends
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_SOURCE = REPO.parent / "shared" / "debugbench"
PROMPT_TOKENS = (400, 1500)  # DebugBench repair prompts: 10-90th percentile ~410-990 tokens

# ---------------------------------------------------------------- memory


def _rss_kib(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field_name}")


def _release_freed_memory() -> None:
    """Free Python garbage and hand freed heap pages back to the OS, so that the resident set
    before a call is not inflated by what the previous call left behind."""
    gc.collect()
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@dataclass
class PeakMemory:
    """Peak memory of the calls inside `measure()`, in MiB (see the module docstring)."""

    device: str
    peak_mib: float = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        import torch

        _release_freed_memory()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            yield
            torch.cuda.synchronize()
            self.peak_mib = torch.cuda.max_memory_allocated() / 2**20
            return
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current VmRSS
        before = _rss_kib("VmRSS")
        yield
        self.peak_mib = (_rss_kib("VmHWM") - before) / 1024


# ---------------------------------------------------------------- prompts


def debugbench_messages(engine: Any, source: str, count: int) -> tuple[list[Any], str]:
    """`count` agent prompts (system + problem + buggy program), one per problem, in a fixed
    order, of PROMPT_TOKENS length when the source has enough of them. Returns (messages,
    a line that says where they came from)."""
    from codeq.policy.prompts import agent_messages
    from codeq.schemas import Task
    from codeq.tasks import load_source

    items = sorted(load_source(source), key=lambda item: (item.slug, item.subtype))
    in_range, others, slugs = [], [], set()
    for item in items:
        if item.slug in slugs:
            continue
        slugs.add(item.slug)
        task = Task(
            task_id=item.slug,
            slug=item.slug,
            level=item.level,  # type: ignore[arg-type]
            category=item.category,  # type: ignore[arg-type]
            subtype=item.subtype,
            description=item.description,
            examples=item.examples,
            constraints=item.constraints,
            buggy_code=item.buggy_code,
            oracle_code=item.oracle_code,
            visible_tests=[],
            hidden_tests=[],
        )
        messages = agent_messages(task)
        length = len(engine.encode_chat(messages))
        low, high = PROMPT_TOKENS
        (in_range if low <= length <= high else others).append(messages)
    chosen = (in_range + others)[:count]
    if len(chosen) < count:  # a small source: prompts repeat (the engine then reads each once)
        chosen = [chosen[i % len(chosen)] for i in range(count)]
    note = f"{len(in_range)} problems of {source} have prompts of {low}-{high} tokens"
    return chosen, note


# ---------------------------------------------------------------- the two arms


@dataclass
class Run:
    """One call of one arm: generated token ids per row (cut after the stop token)."""

    rows: list[list[int]]
    seconds: float
    peak_mib: float
    prompt_tokens_read: int
    cpu_seconds: float = 0.0  # CPU time of the whole process during the call

    @property
    def tokens(self) -> int:
        return sum(len(row) for row in self.rows)


@dataclass
class Case:
    """Prompts to complete: `samples` completions of each distinct prompt."""

    name: str
    messages: list[Any]
    samples: int = 1

    @property
    def rows(self) -> int:
        return len(self.messages) * self.samples


def cut_at_stop(ids: Sequence[int], stops: set[int]) -> list[int]:
    """Ids up to and including the first stop token."""
    out: list[int] = []
    for token in ids:
        out.append(int(token))
        if token in stops:
            break
    return out


def run_engine(engine: Any, case: Case, new_tokens: int) -> Run:
    """A backend's arm (the engine or any other policy backend): one request per distinct
    prompt, `samples` samples each, greedy, no stop but EOS (as `generate`). The prefix cache
    starts empty."""
    from codeq.policy import GenerationRequest

    engine.clear_prefix_cache()
    requests = [
        GenerationRequest(
            m, n=case.samples, temperature=0.0, max_new_tokens=new_tokens, stop="none"
        )
        for m in case.messages
    ]
    memory = PeakMemory(engine.device)
    read_before = engine.stats.prefilled_tokens
    with memory.measure():
        started, cpu = time.perf_counter(), time.process_time()
        results = engine.generate(requests)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    rows = [ids for result in results for ids in result.token_ids]
    read = engine.stats.prefilled_tokens - read_before
    return Run(rows, seconds, memory.peak_mib, read, cpu)


def run_generate(engine: Any, case: Case, new_tokens: int) -> Run:
    """The `generate` arm: the same token ids, each prompt repeated `samples` times, left-padded
    into one batch, greedy, stopping at the engine's stop tokens."""
    import torch
    from transformers import GenerationConfig

    prompts = [engine.encode_chat(m) for m in case.messages for _ in range(case.samples)]
    tokenizer, model = engine.tokenizer, engine.model
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt", padding_side="left")
    batch = {key: value.to(model.device) for key, value in batch.items()}
    stops = sorted(engine.eos_ids)
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=stops,
        pad_token_id=engine.pad_id,
    )
    memory = PeakMemory(engine.device)
    with memory.measure(), torch.inference_mode():
        started, cpu = time.perf_counter(), time.process_time()
        output = model.generate(**batch, generation_config=config)
        if engine.device == "cuda":
            torch.cuda.synchronize()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    width = batch["input_ids"].shape[1]
    rows = [cut_at_stop(row[width:].tolist(), set(stops)) for row in output]
    return Run(rows, seconds, memory.peak_mib, int(batch["input_ids"].numel()), cpu)


GENERATE = "generate"


def run_arm(arm: str, policies: dict[str, Any], case: Case, new_tokens: int) -> Run:
    """`generate` runs on the engine's model; every other arm is the backend of that name."""
    if arm == GENERATE:
        return run_generate(policies["engine"], case, new_tokens)
    return run_engine(policies[arm], case, new_tokens)


# ---------------------------------------------------------------- comparing


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict[str, Any]:
    """Rows equal token for token, and tokens before the first difference."""
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    common = []
    for a, b in zip(ours, theirs, strict=True):
        k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        common.append(min(len(a), len(b)) if k is None else k)
    return {
        "rows": len(ours),
        "identical_rows": same,
        "mean_common_prefix": statistics.mean(common),
    }


def check_parity(label: str, ours: list[list[int]], theirs: list[list[int]]) -> None:
    result = agreement(ours, theirs)
    if result["identical_rows"] != result["rows"]:
        raise AssertionError(
            f"{label}: greedy outputs differ from generate's: {result['identical_rows']} of "
            f"{result['rows']} rows identical"
        )


@dataclass
class CaseResult:
    case: str
    rows: int
    runs: dict[str, list[Run]] = field(default_factory=dict)
    first_token: dict[str, list[float]] = field(default_factory=dict)
    first_token_cpu: dict[str, list[float]] = field(default_factory=dict)
    agreement: dict[str, Any] = field(default_factory=dict)  # the engine's
    agreements: dict[str, dict[str, Any]] = field(default_factory=dict)  # every backend's
    parity: str = ""

    def median(self, arm: str, what: str) -> float:
        runs = self.runs[arm]
        if what == "tokens_per_s":
            return statistics.median(r.tokens / r.seconds for r in runs)
        if what == "tokens_per_cpu_s":
            return statistics.median(r.tokens / max(r.cpu_seconds, 1e-9) for r in runs)
        if what == "peak_mib":
            return statistics.median(r.peak_mib for r in runs)
        if what == "ttft_s":
            return statistics.median(self.first_token[arm])
        if what == "decode_tokens_per_cpu_s":
            first = statistics.median(self.first_token_cpu[arm])
            return statistics.median(
                (r.tokens - len(r.rows)) / max(r.cpu_seconds - first, 1e-9) for r in runs
            )
        if what == "prompt_tokens_read":
            return statistics.median(r.prompt_tokens_read for r in runs)
        raise KeyError(what)

    def ratio(self, what: str = "tokens_per_s", arm: str = "engine") -> float:
        return self.median(arm, what) / self.median(GENERATE, what)

    @property
    def backends(self) -> list[str]:
        return [arm for arm in self.runs if arm != GENERATE]

    def best(self, what: str = "tokens_per_cpu_s") -> str:
        """The arm (`generate` included) with the highest median `what`."""
        return max(self.runs, key=lambda arm: self.median(arm, what))

    def summary(self) -> dict[str, Any]:
        arms = {
            arm: {
                "tokens_per_s": self.median(arm, "tokens_per_s"),
                "tokens_per_cpu_s": self.median(arm, "tokens_per_cpu_s"),
                "decode_tokens_per_cpu_s": self.median(arm, "decode_tokens_per_cpu_s"),
                "cpu_seconds": [r.cpu_seconds for r in self.runs[arm]],
                "ttft_s": self.median(arm, "ttft_s"),
                "peak_mib": self.median(arm, "peak_mib"),
                "prompt_tokens_read": self.median(arm, "prompt_tokens_read"),
                "seconds": [r.seconds for r in self.runs[arm]],
                "tokens": [r.tokens for r in self.runs[arm]],
                "ttft_runs_s": self.first_token[arm],
                "ttft_runs_cpu_s": self.first_token_cpu[arm],
            }
            for arm in self.runs
        }
        return {
            "case": self.case,
            "rows": self.rows,
            "arms": arms,
            "ratio_tokens_per_s": self.ratio(),
            "ratio_tokens_per_cpu_s": self.ratio("tokens_per_cpu_s"),
            "ratio_decode_tokens_per_cpu_s": self.ratio("decode_tokens_per_cpu_s"),
            "ratios": {
                arm: {
                    what: self.ratio(what, arm)
                    for what in ("tokens_per_s", "tokens_per_cpu_s", "decode_tokens_per_cpu_s")
                }
                for arm in self.backends
            },
            "best_tokens_per_s": self.best("tokens_per_s"),
            "best_tokens_per_cpu_s": self.best("tokens_per_cpu_s"),
            "agreement": self.agreement,
            "agreements": self.agreements,
            "parity": self.parity,
        }


def abba(repeats: int, arms: Sequence[str] = ("engine", GENERATE)) -> list[str]:
    """The arms in order, then in reverse order, ... (`repeats` runs of each arm): engine,
    generate, generate, engine with two arms."""
    order: list[str] = []
    for index in range(repeats):
        order += list(arms) if index % 2 == 0 else list(reversed(arms))
    return order


WARM_UP_TOKENS = 8


def measure_case(policies: dict[str, Any], case: Case, new_tokens: int, repeats: int) -> CaseResult:
    """Every backend in `policies` and `generate` (on policies['engine']'s model), ABBA, after
    one untimed warm-up call of each arm on the case: on an H100 the arm that ran first paid
    for kernel selection and allocation (the same engine, batch 16 of 400-1500-token prompts:
    73 tok/s when its part ran first, 311 when second; docs/results/gpu-bench-h100)."""
    arms = [*policies, GENERATE]
    result = CaseResult(case.name, case.rows)
    for arm in arms:
        run_arm(arm, policies, case, min(WARM_UP_TOKENS, new_tokens))
    for arm in abba(repeats, arms):  # time to first token: the same calls, one new token
        run = run_arm(arm, policies, case, 1)
        result.first_token.setdefault(arm, []).append(run.seconds)
        result.first_token_cpu.setdefault(arm, []).append(run.cpu_seconds)
    for arm in abba(repeats, arms):
        run = run_arm(arm, policies, case, new_tokens)
        result.runs.setdefault(arm, []).append(run)
        print(
            f"  {case.name:>12} {arm:>12}: {run.tokens / run.seconds:8.1f} tokens/s "
            f"({run.tokens} tokens in {run.seconds:.1f}s, {run.cpu_seconds:.1f} CPU-s, peak "
            f"{run.peak_mib:.0f} MiB)",
            file=sys.stderr,
            flush=True,
        )
    theirs = result.runs[GENERATE][0].rows
    result.agreement = agreement(result.runs["engine"][0].rows, theirs)
    for arm in result.backends:
        result.agreements[arm] = agreement(result.runs[arm][0].rows, theirs)
    return result


PARITY_BACKENDS = ("engine", "transformers")  # vLLM's kernels differ: agreement reported only


def assert_parity_float32(
    policies32: dict[str, Any], case: Case, rows: int, new_tokens: int
) -> str:
    """The case's first `rows` rows (whole prompts with all their samples) in float32: each
    backend's greedy tokens must equal generate's."""
    prompts = max(1, rows // case.samples)
    small = Case(case.name, case.messages[:prompts], case.samples)
    theirs = run_generate(policies32["engine"], small, new_tokens)
    checked = [arm for arm in policies32 if arm in PARITY_BACKENDS]
    for arm in checked:
        ours = run_engine(policies32[arm], small, new_tokens)
        check_parity(f"{case.name} {arm} (float32)", ours.rows, theirs.rows)
    return f"float32: {small.rows} rows x {new_tokens} tokens identical ({', '.join(checked)})"


# ---------------------------------------------------------------- decode-step profile


PROFILED_STEPS = 10


def decode_profile(engine: Any, messages: list[Any], steps: int) -> None:
    """Decode steps of each arm on the same prompts (after the prompt read and one warm-up
    step), engine then generate, each arm's alone: `steps` steps timed in thread CPU time (on
    a shared CPU wall time also counts other processes' slices), then PROFILED_STEPS more
    under the PyTorch profiler for the self time per operator. The profiler is off for the
    timed steps because it slows the arms unequally: at batch 8 (SmolLM2, 8 DebugBench
    prompts) generate's step took 164-197 ms of thread CPU unprofiled and 296-472 ms profiled
    (its per-layer KV `torch.cat` the difference), the engine's 165 ms either way; with one
    engine step run inside each of generate's streamer callbacks, 622 ms."""
    measured = {}
    for arm, measure in (("engine", _engine_steps), ("generate", _generate_steps)):
        engine.clear_prefix_cache()
        measured[arm] = measure(engine, messages, steps)
    _print_decode_profile(measured, PROFILED_STEPS)


def _engine_steps(engine: Any, messages: list[Any], steps: int) -> tuple[list[float], Any]:
    from torch.profiler import ProfilerActivity, profile

    from codeq.policy import GenerationRequest

    stream = engine.stream()
    for m in messages:
        stream.submit(
            GenerationRequest(
                m, n=1, temperature=0.0, max_new_tokens=steps + PROFILED_STEPS + 8, stop="none"
            )
        )
    stream.step()  # the prompts read, the first token
    stream.step()  # a warm-up decode step
    times = []
    for _ in range(steps):
        began = time.thread_time()
        stream.step()
        times.append(time.thread_time() - began)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        for _ in range(PROFILED_STEPS):
            stream.step()
    if len(stream.sequences) != len(messages):
        print(f"note: {len(messages) - len(stream.sequences)} engine rows stopped at EOS early")
    return times, profiler.events()


def _generate_steps(engine: Any, messages: list[Any], steps: int) -> tuple[list[float], Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    times: list[float] = []
    profiler = profile(activities=[ProfilerActivity.CPU])

    class Timer(BaseStreamer):  # type: ignore[misc]
        """Called once with the prompt, then once a token: the time between two calls after
        the first token and a warm-up step is one decode step."""

        calls, last = 0, 0.0

        def put(self, value: Any) -> None:
            now = time.thread_time()
            self.calls += 1
            if 3 < self.calls <= steps + 3:
                times.append(now - self.last)
            if self.calls == steps + 3:
                profiler.start()
            self.last = time.thread_time()

        def end(self) -> None:
            profiler.stop()

    ids = [engine.encode_chat(m) for m in messages]
    batch = engine.tokenizer.pad({"input_ids": ids}, return_tensors="pt", padding_side="left")
    config = GenerationConfig(
        max_new_tokens=steps + PROFILED_STEPS + 2,
        min_new_tokens=steps + PROFILED_STEPS + 2,
        do_sample=False,
        eos_token_id=sorted(engine.eos_ids),
        pad_token_id=engine.pad_id,
    )
    with torch.inference_mode():
        engine.model.generate(**batch, generation_config=config, streamer=Timer())
    return times, profiler.events()


def _print_decode_profile(measured: dict[str, tuple[list[float], Any]], profiled: int) -> None:
    import collections

    per_op = {arm: collections.Counter[str]() for arm in measured}
    calls = {arm: collections.Counter[str]() for arm in measured}
    for arm, (_, events) in measured.items():
        for event in events:
            per_op[arm][event.name] += event.self_cpu_time_total
            calls[arm][event.name] += 1
    cpu = {}
    for arm, (times, _) in measured.items():
        cpu[arm] = statistics.median(times)
        print(
            f"{arm:>8}: {cpu[arm] * 1e3:7.1f} ms thread CPU a step (median of {len(times)}; "
            f"quartiles {statistics.quantiles(times)[0] * 1e3:.1f}-"
            f"{statistics.quantiles(times)[2] * 1e3:.1f})"
        )
    print(
        f"{f'operator (self time a step, wall, {profiled} profiled steps)':52} {'engine ms':>9} "
        f"{'generate ms':>11} "
        f"{'calls':>6} {'calls':>6}"
    )
    names = sorted(
        per_op["engine"].keys() | per_op["generate"].keys(),
        key=lambda n: -(per_op["engine"][n] + per_op["generate"][n]),
    )
    arms = ("engine", "generate")
    for name in [*names[:15], None]:
        cells = [
            (sum(per_op[a].values()) if name is None else per_op[a][name]) / profiled / 1e3
            for a in arms
        ] + [(sum(calls[a].values()) if name is None else calls[a][name]) / profiled for a in arms]
        label = "all profiler events" if name is None else name[:52]
        print(f"{label:52} {cells[0]:9.2f} {cells[1]:11.2f} {cells[2]:6.0f} {cells[3]:6.0f}")
    print(
        f"ratio generate / engine, thread CPU a decode step: {cpu['generate'] / cpu['engine']:.2f}x"
    )


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="policy model (default smollm2)")
    parser.add_argument("--batches", type=int, nargs="+", help="default 1 8 32 (CUDA: 1 8 32 64)")
    parser.add_argument(
        "--siblings",
        default="4x8",
        help="PROMPTSxSAMPLES: K samples of a few prompts ('' to skip; default 4x8)",
    )
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each arm, ABBA (default 2)")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"]
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument(
        "--parity-rows", type=int, default=4, help="rows checked in float32 per case (0: none)"
    )
    parser.add_argument(
        "--source", default=str(DEFAULT_SOURCE) if DEFAULT_SOURCE.is_dir() else "builtin"
    )
    parser.add_argument("--json", help="also write every number here")
    parser.add_argument(
        "--decode-profile",
        type=int,
        metavar="BATCH",
        help="instead: profile decode steps of both arms at this batch, one step each in turn",
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=["engine", "transformers", "vllm"],
        help="policy backends to run beside generate (default: every one that can run here; "
        "the engine always runs, generate uses its model)",
    )
    return parser.parse_args(argv)


def load_engine(args: argparse.Namespace, dtype: str, batch_size: int) -> Any:
    from codeq.config import PolicyConfig
    from codeq.policy import PolicyEngine

    config = PolicyConfig(
        model=args.model,
        dtype=dtype,  # type: ignore[arg-type]
        batch_size=batch_size,
        cpu_threads=args.threads,
        max_prompt_tokens=4096,
    )
    return PolicyEngine.load(config, seed=0)


def backends(args: argparse.Namespace, engine: Any, found: list[Case]) -> dict[str, Any]:
    """The engine and the other chosen backends, ready to generate `found`."""
    from codeq.config import PolicyConfig
    from codeq.policy.backends import available_backends

    config = PolicyConfig(
        model=args.model,
        dtype=args.dtype,
        batch_size=engine.batch_size,
        max_prompt_tokens=4096,
        max_new_tokens=max(args.new_tokens, 16),
    )
    chosen = args.backends or available_backends(config)
    policies: dict[str, Any] = {"engine": engine}
    if "transformers" in chosen:
        policies["transformers"] = transformers_over(engine, found, args.new_tokens)
    if "vllm" in chosen:
        from codeq.policy.vllm_backend import VllmPolicy

        vllm_config = config.model_copy(update={"backend": "vllm"})
        policies["vllm"] = VllmPolicy.load(vllm_config, seed=0, gpu_memory_utilization=0.4)
    return policies


def transformers_over(engine: Any, found: list[Case], new_tokens: int) -> Any:
    """The transformers backend over the engine's loaded model, its paged cache sized for the
    largest case (every prompt and every row's new tokens, a block of slack a row)."""
    from codeq.policy.transformers_backend import PAGE_TOKENS, TransformersPolicy

    def tokens(case: Case) -> int:
        prompts = sum(len(engine.encode_chat(m)) for m in case.messages)
        return prompts + case.rows * (new_tokens + 2 * PAGE_TOKENS)

    return TransformersPolicy(engine, cache_tokens=max(tokens(case) for case in found))


def cases(args: argparse.Namespace, engine: Any) -> tuple[list[Case], str]:
    batches = args.batches or ([1, 8, 32, 64] if engine.device == "cuda" else [1, 8, 32])
    prompts, samples = 0, 0
    if args.siblings:
        prompts, samples = (int(x) for x in args.siblings.lower().split("x"))
    messages, note = debugbench_messages(engine, args.source, max([*batches, prompts]))
    found = [Case(f"batch {b}", messages[:b]) for b in batches]
    if prompts:
        found.append(Case(f"{prompts}x{samples} siblings", messages[:prompts], samples))
    return found, note


def machine() -> str:
    import platform

    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return f"{model}, {torch.get_num_threads()} torch threads"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    engine = load_engine(args, args.dtype, 64)
    if args.decode_profile:
        messages, note = debugbench_messages(engine, args.source, args.decode_profile)
        print(f"decode profile: {args.model} on {machine()} ({engine.dtype}); {note}")
        decode_profile(engine, messages, min(args.new_tokens, 40))
        return 0
    found, note = cases(args, engine)
    engine.batch_size = max(case.rows for case in found)
    policies = backends(args, engine, found)
    print(
        f"generate bench: {args.model} on {machine()} ({engine.dtype}), {args.new_tokens} new "
        f"tokens, greedy, {args.repeats} runs per arm (ABBA); backends: {', '.join(policies)}; "
        f"prompts: {note}",
        flush=True,
    )
    policies32 = None
    if args.parity_rows and str(engine.dtype) != "torch.float32":
        engine32 = load_engine(args, "float32", engine.batch_size)
        policies32 = {"engine": engine32}
        if "transformers" in policies:
            policies32["transformers"] = transformers_over(engine32, found, args.new_tokens)
    results: list[CaseResult] = []
    for case in found:
        lengths = [len(engine.encode_chat(m)) for m in case.messages]
        print(
            f"{case.name}: {case.rows} rows, prompts of {min(lengths)}-{max(lengths)} tokens "
            f"(median {statistics.median(lengths):.0f})",
            flush=True,
        )
        result = measure_case(policies, case, args.new_tokens, args.repeats)
        if str(engine.dtype) == "torch.float32":  # the timed runs are the parity check
            checked = [arm for arm in result.backends if arm in PARITY_BACKENDS]
            for arm in checked:
                check_parity(
                    f"{case.name} {arm}", result.runs[arm][0].rows, result.runs[GENERATE][0].rows
                )
            result.parity = f"float32: all {case.rows} timed rows identical ({', '.join(checked)})"
        elif policies32 is not None:
            result.parity = assert_parity_float32(
                policies32, case, args.parity_rows, args.new_tokens
            )
        else:
            result.parity = "not checked (--parity-rows 0)"
        results.append(result)
        print_case(result, str(engine.dtype).removeprefix("torch."))
        if args.json:  # after every case, so a long run that is stopped keeps what it measured
            summary = {
                "model": args.model,
                "machine": machine(),
                "dtype": str(engine.dtype),
                "backends": list(policies),
                "new_tokens": args.new_tokens,
                "repeats": args.repeats,
                "prompts": note,
                "cases": [r.summary() for r in results],
            }
            Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    print_ratios(results)
    return 0


def print_case(result: CaseResult, dtype: str) -> None:
    for arm in result.runs:
        print(
            f"  {arm:>12}: {result.median(arm, 'tokens_per_s'):8.1f} tokens/s  "
            f"{result.median(arm, 'tokens_per_cpu_s'):8.1f} tokens/CPU-s  "
            f"{result.median(arm, 'decode_tokens_per_cpu_s'):8.1f} decode tokens/CPU-s  "
            f"TTFT {result.median(arm, 'ttft_s'):6.2f}s  peak {result.median(arm, 'peak_mib'):7.0f} "
            f"MiB  prompt tokens read {result.median(arm, 'prompt_tokens_read'):.0f}",
            flush=True,
        )
    for arm, agree in result.agreements.items():
        print(
            f"  {dtype} agreement {arm} / generate: {agree['identical_rows']}/{agree['rows']} "
            f"rows identical, {agree['mean_common_prefix']:.0f} tokens before the first "
            "difference on average",
            flush=True,
        )
    print(f"  parity {result.parity}", flush=True)


def print_ratios(results: list[CaseResult]) -> None:
    """One line a backend (its ratios to generate, case by case), then the best arm of each
    case per CPU-second and per wall second."""
    for arm in results[0].backends:
        parts = [
            f"{r.case}: {r.ratio('tokens_per_s', arm):.2f}x ("
            f"{r.ratio('tokens_per_cpu_s', arm):.2f}x per CPU-second, decode steps alone "
            f"{r.ratio('decode_tokens_per_cpu_s', arm):.2f}x)"
            for r in results
        ]
        print(f"ratio {arm} / generate (tokens/s, medians): " + ", ".join(parts), flush=True)
    best = [
        f"{r.case}: {r.best('tokens_per_cpu_s')} per CPU-second, {r.best('tokens_per_s')} per "
        "second"
        for r in results
    ]
    print("best: " + "; ".join(best), flush=True)


if __name__ == "__main__":
    sys.exit(main())
