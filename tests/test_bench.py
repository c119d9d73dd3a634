"""The generation and GPU benchmarks and the paired comparison of two evaluations: their
comparisons (parity, ABBA order, what a row counts, the projection's arithmetic, gained and lost
tasks) and a tiny run of each. Timings are not checked: a run on this
machine only proves the code path works."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str):
    """bench/NAME.py as the module NAME (gpu.py imports generate.py as a sibling)."""
    if name in sys.modules:
        return sys.modules[name]
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


generate = load_bench("generate")
gpu = load_bench("gpu")


def test_arms_alternate_engine_generate_generate_engine():
    assert generate.abba(2) == ["engine", "generate", "generate", "engine"]
    assert generate.abba(3) == ["engine", "generate", "generate", "engine", "engine", "generate"]
    arms = ["engine", "transformers", "generate"]
    assert generate.abba(2, arms) == [*arms, *reversed(arms)]


def test_rows_end_at_their_stop_token_and_parity_fails_on_any_difference():
    assert generate.cut_at_stop([5, 6, 2, 7, 2], {2}) == [5, 6, 2]
    assert generate.cut_at_stop([5, 6], {2}) == [5, 6]
    generate.check_parity("same", [[1, 2], [3]], [[1, 2], [3]])
    with pytest.raises(AssertionError, match="1 of 2 rows identical"):
        generate.check_parity("differs", [[1, 2], [3]], [[1, 2], [4]])
    assert generate.agreement([[1, 2, 3], [4, 5]], [[1, 2, 9], [4, 5]]) == {
        "rows": 2,
        "identical_rows": 1,
        "mean_common_prefix": 2,
    }


def test_generate_bench_checks_parity_and_prints_the_ratios_last(tiny_model_dir, tmp_path, capsys):
    """float32 on the tiny model, every backend that runs on a CPU and generate: the timed
    outputs must be equal; the siblings case reads each prompt once in the backends and once
    per sample in generate; the last lines give each backend's ratios and each case's best."""
    out = tmp_path / "generate.json"
    args = ["--model", str(tiny_model_dir), "--batches", "1", "3", "--siblings", "2x3"]
    args += ["--new-tokens", "6", "--dtype", "float32", "--source", "builtin", "--json", str(out)]
    assert generate.main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-3].startswith("ratio engine / generate")
    assert lines[-2].startswith("ratio transformers / generate")
    assert lines[-1].startswith("best: batch 1: ")
    for line in lines[-3:]:
        assert all(case in line for case in ("batch 1", "batch 3", "2x3 siblings"))
    assert "decode steps alone" in lines[-2]
    summary = json.loads(out.read_text())
    assert summary["backends"] == ["engine", "transformers"]
    cases = {case["case"]: case for case in summary["cases"]}
    assert all("identical (engine, transformers)" in case["parity"] for case in cases.values())
    siblings = cases["2x3 siblings"]["arms"]
    for arm in ("engine", "transformers"):
        assert siblings[arm]["prompt_tokens_read"] * 3 <= siblings["generate"]["prompt_tokens_read"]
        assert cases["batch 3"]["agreements"][arm]["identical_rows"] == 3
    assert cases["batch 3"]["best_tokens_per_cpu_s"] in ("engine", "transformers", "generate")
    for arm in (
        "engine",
        "transformers",
        "generate",
    ):  # the decode steps alone: the TTFT call's CPU taken off
        batch3 = cases["batch 3"]["arms"][arm]
        assert len(batch3["ttft_runs_cpu_s"]) == 2 and batch3["decode_tokens_per_cpu_s"] > 0


def test_bench_model_folder_tokenizes_one_token_a_letter(tmp_path):
    """Through AutoTokenizer on the saved folder, as the engine and the trainer load it
    (transformers 5 rebuilds a Qwen2 folder's tokenizer as Qwen2Tokenizer)."""
    from transformers import AutoConfig, AutoTokenizer

    gpu.char_tokenizer(1024, gpu.TINY_SPECIAL_IDS).save_pretrained(tmp_path)
    AutoConfig.for_model(**gpu.TINY).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    [messages] = gpu.chat_prompts(1, (40, 40))
    text = tokenizer.apply_chat_template(
        [m.model_dump() for m in messages], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    overhead = gpu.token_count(tokenizer, [{"role": "user", "content": ""}], True)
    assert len(ids) == 40 + overhead
    assert ids[0] == 1022 and ids.count(1022) == 2 and ids.count(1023) == 1
    assert tokenizer.decode([900, 1023, 901], skip_special_tokens=True) == "w900w901"


def test_bench_pairs_are_exactly_the_training_length(tmp_path):
    run = gpu.settings(gpu.parse_args(["--tiny"]))
    folder = gpu.make_model_folder(run, tmp_path / "model")
    from codeq.train.model import load_tokenizer

    tokenizer = load_tokenizer(str(folder))
    [pair] = gpu.training_pairs(run, tokenizer, 1)
    chat = [{"role": "user", "content": pair.prompt[0].content}]
    rejected = [*chat, {"role": "assistant", "content": pair.rejected}]
    assert gpu.token_count(tokenizer, rejected, False) == run.train_length


def test_weight_bytes_leave_out_the_embedding_table():
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    model = AutoModelForCausalLM.from_config(Qwen2Config(**gpu.TINY), dtype=torch.bfloat16)
    every = sum(p.numel() * 2 for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    embedding = gpu.TINY["vocab_size"] * gpu.TINY["hidden_size"] * 2
    assert gpu.weight_bytes(model) == every - embedding


def test_bandwidth_is_chosen_by_device_name():
    assert gpu.bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert gpu.bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert gpu.bandwidth("NVIDIA H200") == 4.8e12
    assert gpu.bandwidth("AMD EPYC") is None


def test_round_projection_divides_collection_by_the_gpus_and_adds_one_training():
    rows = [
        gpu.Row(
            "(a) generate",
            "engine NF4",
            "batch 64",
            1000.0,  # tokens/s
            "tok/s",
            ttft_s=2.0,
            extra={"mean_prompt_tokens": 500},  # 64 * 500 / 2 = 16,000 prompt tokens/s
        ),
        gpu.Row("(b) DPO step", "QLoRA NF4 (bf16 compute)", "16 pairs", 36.0, "s/step"),
    ]
    work = gpu.RoundWork(pairs=1600, tasks=100, gpus=(1, 4))
    one, four = gpu.projection_rows(rows, work, 64)
    per_task = 24 * (300 + 12) / 1000 + 5000 / 16_000
    train_hours = 100 * 36.0 / 3600
    assert one.value == pytest.approx(100 * per_task / 3600 + train_hours)
    assert four.value == pytest.approx(100 * per_task / 4 / 3600 + train_hours)


@pytest.mark.slow
def test_gpu_bench_tiny_runs_every_part_on_cpu(tmp_path):
    """`python bench/gpu.py --tiny`, in its two-call form: generation in float32 (parity
    asserted inside), then one DPO step in each precision through codeq.train.dpo and the
    projection from both calls' numbers; NF4 skipped with a reason."""

    def bench(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(BENCH / "gpu.py"), "--tiny", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        assert (
            "NF4 and FP8 skipped: bitsandbytes' 4-bit kernels and FP8 are CUDA's" in result.stdout
        )
        return result

    first, second = tmp_path / "generate.json", tmp_path / "all.json"
    bench("--only", "generate", "--json", str(first))
    result = bench("--only", "train", "--with-json", str(first), "--json", str(second))
    rows = json.loads(second.read_text())
    arms = {(r["part"], r["arm"], r["setting"]) for r in rows if r["value"]}
    for setting in ("batch 1", "batch 4", "2x3 siblings"):
        for arm in ("engine", "transformers", "generate"):
            assert ("(a) generate", f"{arm} float32", setting) in arms
    assert {r["arm"] for r in rows if r["part"] == "(b) DPO step" and r["value"]} == {
        "LoRA bf16",
        "LoRA fp32",
    }
    assert len([r for r in rows if r["part"] == "(c) round" and r["value"]]) == 3
    assert "| (c) round | collect on 8 GPUs, train on 1 |" in result.stdout


def test_decode_profile_times_each_arms_steps_alone(tiny_model_dir, capsys):
    args = ["--model", str(tiny_model_dir), "--decode-profile", "2", "--new-tokens", "5"]
    assert generate.main([*args, "--dtype", "float32", "--source", "builtin"]) == 0
    out = capsys.readouterr().out
    for arm in ("engine", "generate"):
        assert re.search(rf"{arm}: +[\d.]+ ms thread CPU a step \(median of 5;", out), out
    assert "aten::mm" in out
    assert out.strip().splitlines()[-1].startswith("ratio generate / engine, thread CPU")


def test_compare_evals_pairs_mcts_budgets_with_best_of_n_at_their_most_programs(tmp_path):
    compare_evals = load_bench("compare_evals")
    mcts = _results(
        "test", {"a": True, "b": False, "c": False}, {"a": False, "b": True, "c": False}
    )
    bon = _results("test", {"a": False, "b": False, "c": False}, {})
    bon["bon_ablation"] = {
        "4": {"solved": 2, "per_task": {"a": False, "b": True, "c": True}, "programs": 4.0},
        "8": {"solved": 1, "per_task": {"a": False, "b": False, "c": True}, "programs": 8.0},
    }
    mcts["mcts_rollout_ablation"]["4"] = mcts["modes"]["mcts"]
    pairs = compare_evals.mcts_against_bon(mcts, bon, rewrites=2)
    assert pairs == [("mcts@2", "bon@4"), ("mcts@4", "bon@8")]
    rows = {row["figure"]: row for row in compare_evals.compare(mcts, bon, pairs)}
    assert (rows["mcts@2 vs bon@4"]["gained"], rows["mcts@2 vs bon@4"]["lost"]) == (0, 1)
    assert (rows["mcts@4 vs bon@8"]["first"], rows["mcts@4 vs bon@8"]["second"]) == (1, 1)
    assert (rows["mcts@4 vs bon@8"]["gained"], rows["mcts@4 vs bon@8"]["lost"]) == (1, 1)
    (tmp_path / "mcts.json").write_text(json.dumps(mcts))
    (tmp_path / "bon.json").write_text(json.dumps(bon))
    script = [sys.executable, str(BENCH / "compare_evals.py"), str(tmp_path / "mcts.json")]
    done = subprocess.run(
        [*script, str(tmp_path / "bon.json"), "--mcts-vs-bon", "2"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "| mcts@4 vs bon@8 | 3 | 1 | 1 | +1 / -1" in done.stdout
    done = subprocess.run(
        [*script, str(tmp_path / "bon.json"), "--mcts-vs-bon", "8"], capture_output=True, text=True
    )
    assert done.returncode != 0 and "best-of-(K*b)" in done.stderr


def _results(split: str, per_task: dict[str, bool], budget_two: dict[str, bool]) -> dict:
    def figure(solved: dict[str, bool]) -> dict:
        return {"solved": sum(solved.values()), "per_task": solved, "programs": 2.0}

    return {
        "split": split,
        "task_ids": sorted(per_task),
        "modes": {"mcts": figure(per_task), "zero_shot": figure(per_task)},
        "mcts_rollout_ablation": {"2": figure(budget_two)},
        "bon_ablation": {},
    }


def test_compare_evals_pairs_every_shared_figure_and_refuses_other_tasks(tmp_path):
    compare_evals = load_bench("compare_evals")
    first = _results(
        "validation", {"a": True, "b": True, "c": False}, {"a": True, "b": False, "c": False}
    )
    second = _results(
        "validation", {"a": False, "b": True, "c": True}, {"a": True, "b": True, "c": False}
    )
    second["modes"].pop("zero_shot")
    rows = {row["figure"]: row for row in compare_evals.compare(first, second)}
    assert sorted(rows) == ["mcts", "mcts@2"]  # zero_shot is not in both
    assert (rows["mcts"]["first"], rows["mcts"]["gained"], rows["mcts"]["lost"]) == (2, 1, 1)
    assert rows["mcts"]["p_first_better"] == 0.75
    assert (rows["mcts@2"]["gained"], rows["mcts@2"]["lost"]) == (0, 1)
    # headline figures searched with different rollouts are paired by budget, not by mode name
    first["modes"]["mcts"]["rollouts"], second["modes"]["mcts"]["rollouts"] = 8, 2
    rows = {row["figure"]: row for row in compare_evals.compare(first, second)}
    assert sorted(rows) == ["mcts@2"] and rows["mcts@2"]["second"] == 2
    elsewhere = _results("test", {"a": True, "b": True, "c": False}, {})
    with pytest.raises(SystemExit, match="not on the same tasks"):
        compare_evals.compare(first, elsewhere)
    (tmp_path / "one.json").write_text(json.dumps(first))
    (tmp_path / "two.json").write_text(json.dumps(second))
    script = [sys.executable, str(BENCH / "compare_evals.py"), str(tmp_path / "one.json")]
    done = subprocess.run([*script, str(tmp_path / "two.json")], capture_output=True, text=True)
    assert done.returncode == 0 and "| mcts@2 | 3 | 1 | 2 | +0 / -1 (p = 1.0) |" in done.stdout


def test_resume_determinism_finds_resumed_searches_identical(tiny_model_dir, tmp_path):
    from codeq import cli

    assert cli.run(["prepare", "--source", "builtin", "--out", str(tmp_path / "tasks")]) == 0
    out = tmp_path / "resume.json"
    result = subprocess.run(
        [sys.executable, str(BENCH / "resume_determinism.py")]
        + ["--tasks", str(tmp_path / "tasks" / "train.jsonl"), "--tasks-count", "5"]
        + ["--skip", "3", "--parallel-trees", "2", "--model", str(tiny_model_dir)]
        + ["--max-new-tokens", "16", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=BENCH.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["tasks"] == 5 and found["uninterrupted_twice_identical"] is True
    assert len(found["resumed_identical_per_task"]) == 2
    assert found["resumed_identical"] == 2


def test_the_device_script_runs_gpu_bench_with_arguments_it_accepts(tmp_path):
    """bench/device_check.sh: its bench/gpu.py call parses, and without a GPU it stops at once
    with gpu.py's error, having written what machine it ran on."""
    script = (BENCH / "device_check.sh").read_text()
    call = re.search(r"timeout 540 \S+ bench/gpu.py (.*?) >", script.replace("\\\n", " "))
    arguments = call.group(1).replace('"$out/', str(tmp_path) + "/").replace('"', "").split()
    arguments = [a for a in arguments if not a.startswith("${")]
    args = gpu.parse_args(arguments)
    assert (args.new_tokens, args.repeats, args.budget_s, args.tiny) == (64, 2, 420, False)
    environment = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(BENCH / "device_check.sh")], capture_output=True, text=True, env=environment
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: no CUDA device" in (tmp_path / "gpu.log").read_text()
    assert "torch" in (tmp_path / "machine.txt").read_text()


def test_cpu_dtype_bench_writes_both_arms_and_their_ratio(tmp_path, monkeypatch):
    bench = load_bench("cpu_dtype")
    row = bench.measure(8, backward=True, repeats=2)
    assert row["float32_ms"] > 0 and row["bfloat16_ms"] > 0
    assert row["float32_over_bfloat16"] == pytest.approx(row["float32_ms"] / row["bfloat16_ms"])
    out = tmp_path / "dtype.json"
    monkeypatch.setattr(bench, "ROWS", {"decode, 8 rows": 8})
    monkeypatch.setattr(
        sys, "argv", ["cpu_dtype.py", "--threads", "1", "--repeats", "1", "--out", str(out)]
    )
    bench.main()
    recorded = json.loads(out.read_text())
    (written,) = recorded["rows"]
    assert written["shape"] == "decode, 8 rows" and written["pass"] == "forward"
    assert recorded["cpu"] and recorded["torch"]  # the answer is the CPU's, so it is named


def test_results_page_replaces_only_the_table_after_its_marker():
    page = load_bench("results_page")
    text = "# A\n\n| x |\n|---|\n| 1 |\n\n**Third curve** says:\n\n| y |\n|---|\n| 2 |\n\nafter\n"
    replaced = page.replace_table_after(text, "**Third curve**", "| y |\n|---|\n| 3 |\n| 4 |\n")
    assert replaced == text.replace("| 2 |", "| 3 |\n| 4 |")


def test_search_modes_pairs_the_three_searches_at_equal_programs(
    tiny_model_dir, tmp_path, monkeypatch
):
    """bench/search_modes.py on real validation tasks with the tiny model: one evaluation of
    MCTS, best-of-N and multi-turn best-of-N, every pairing at equal programs on the same tasks,
    each search's cost, and a verdict in the terms of issue 37's goal."""
    from codeq import cli

    assert cli.run(["prepare", "--source", "builtin", "--out", str(tmp_path / "tasks")]) == 0
    validation = tmp_path / "tasks" / "validation.jsonl"
    out = tmp_path / "modes.json"
    command = [sys.executable, str(BENCH / "search_modes.py"), "--tasks", str(validation)]
    command += ["--model", str(tiny_model_dir), "--tiny", "--max-new-tokens", "16"]
    command += ["--rewrites", "1", "--rollouts", "2", "--samples", "1", "--turns", "2"]
    command += ["--out", str(tmp_path / "eval"), "--json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(out.read_text())
    assert found["split"] == "validation" and found["programs_at_most"] == 2
    assert [row["mode"] for row in found["rows"]] == [
        "mcts@1 vs bon@1",
        "mcts@2 vs bon@2",
        "mt_bon@1x1 vs bon@1",
        "mt_bon@1x2 vs bon@2",
        "mt_bon@1x2 vs mcts@2",
    ]
    tasks = set(found["task_ids"])
    for row in found["rows"]:
        assert row["tasks"] == len(tasks) and set(row["gained"] + row["lost"]) <= tasks
    for mode, figures in found["per_task"].items():
        assert all(set(per_task) == tasks for per_task in figures.values()), mode
    assert 0 < found["searches"]["bon"]["programs"] <= 2
    assert "best-of-2 " in found["verdict"] and found["verdict"] in result.stdout
    shown = [sys.executable, str(BENCH / "search_modes.py"), "--show", str(out)]
    tables = subprocess.run(shown, capture_output=True, text=True, timeout=60, cwd=BENCH.parent)
    assert tables.returncode == 0 and tables.stdout.strip() in result.stdout  # the live tables
    assert [choice["mode"] for choice in found["selection"]] == ["bon", "mt_bon", "mcts"]
    for choice in found["selection"]:  # the choice can lose only tasks some rewrite solves
        assert set(choice["lost"]) <= tasks and len(choice["lost"]) <= choice["solvable"]
        assert choice["solvable"] <= choice["visible_passing"] <= len(tasks)

    # the ledger recomputes every row task by task from the evaluation's results beside it
    paired_tests = load_bench("paired_tests")
    monkeypatch.setattr(paired_tests, "RESULTS", tmp_path)
    entries = paired_tests.search_modes_entries([out.name])
    assert [entry.what.split(", ")[-1] for entry in entries] == [r["mode"] for r in found["rows"]]
    assert [entry.role for entry in entries] == ["", "decided", "", "decided", ""]
    sets = {("validation", len(tasks)): found["task_ids"]}
    for entry in entries:
        assert paired_tests.check_entry(entry, sets) == ("recomputed", [])
    wrong = dataclasses.replace(entries[1], gained=entries[1].gained + 1)
    assert paired_tests.check_entry(wrong, sets)[1]

    # the same command again (as after an interruption) reads the trees it saved: the same rows
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=BENCH.parent)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(out.read_text())["rows"] == found["rows"]

    # another machine: the trees kept for git, restored into an empty folder, give the same rows
    keep = tmp_path / "kept"
    persist = command + ["--keep", str(keep), "--persist"]
    kept = subprocess.run(persist, capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert {p.name for p in keep.iterdir()} >= {
        f"trajectories-{mode}.partial.jsonl.xz" for mode in ("bon", "mt_bon", "mcts")
    }
    elsewhere = [
        tmp_path / "elsewhere" if part == str(tmp_path / "eval") else part for part in command
    ]
    moved = subprocess.run(
        [str(part) for part in elsewhere] + ["--keep", str(keep)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=BENCH.parent,
    )
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert "restored trajectories-mcts.partial.jsonl" in moved.stderr
    assert "trees kept in" not in moved.stderr  # nothing searched, so no edge reached
    for mode in ("bon", "mt_bon", "mcts"):  # nothing searched again: the same trees, no more
        name = f"trajectories-{mode}.partial.jsonl"
        assert (tmp_path / "elsewhere" / name).read_text() == (tmp_path / "eval" / name).read_text()
    assert json.loads(out.read_text())["rows"] == found["rows"]


@pytest.mark.parametrize("record", ["base-test.json", "round-16-test.json", "round-15-test.json"])
def test_search_modes_readme_shows_each_test_runs_table_as_its_record_gives_it(record):
    """The README's outcome tables are what `--show` prints from the committed record, so a
    figure mistyped or left stale there fails here."""
    modes = BENCH.parent / "docs" / "results" / "search-modes"
    command = [sys.executable, str(BENCH / "search_modes.py"), "--show", str(modes / record)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=BENCH.parent)
    assert result.returncode == 0, result.stderr
    rows = [
        line for line in result.stdout.splitlines() if " vs bon@" in line or " vs mcts@" in line
    ]
    readme = (modes / "README.md").read_text().splitlines()
    assert len(rows) == 9 and [row for row in rows if row not in readme] == []


@pytest.mark.parametrize("text", ["{", '{"rows": []}', "[1]"])
def test_search_modes_show_refuses_what_is_not_a_record(tmp_path, text):
    broken = tmp_path / "broken.json"
    broken.write_text(text)
    command = [sys.executable, str(BENCH / "search_modes.py"), "--show", str(broken)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=BENCH.parent)
    assert result.returncode != 0 and result.stderr.startswith("error: --show reads")
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--tasks", "test.jsonl"], "never on test tasks"),
        (["--tasks", "validation.jsonl", "--samples", "3"], "must equal --rewrites x --rollouts"),
        (["--tasks", "validation.jsonl", "--test-run"], "give a test.jsonl"),
        (["--tasks", "test.jsonl", "--test-run", "--json", "t.json"], "needs --verifier DIR"),
        (["--tasks", "validation.jsonl", "--skip", "60"], "belong to --test-run"),
        (
            ["--tasks", "test.jsonl", "--test-run", "--verifier", "v", "--json", "README.md"],
            "the test tasks are run once",
        ),
        (["--tasks", "validation.jsonl", "--policy", "round-16.json"], "go together"),
        (
            ["--tasks", "validation.jsonl", "--policy", "r.json", "--store", "s", "--adapter", "a"],
            "leave out --adapter",
        ),
    ],
)
def test_search_modes_refuses_test_tasks_and_unequal_budgets(arguments, message):
    command = [sys.executable, str(BENCH / "search_modes.py"), "--model", "m", *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert result.returncode != 0 and message in result.stderr


def test_search_modes_loads_a_promoted_policy_merged_from_its_round_record(
    tiny_model_dir, tiny_adapter_dir, tmp_path
):
    """--policy round-N.json --store DIR: the candidate's adapters read from the store, checked
    and merged into --model as the curve evaluates it; a kept-out round, another base model and
    an adapter with other weights are each refused with the error naming why."""
    import shutil

    from codeq.config import load_config
    from codeq.errors import BadInputError, ConfigError, MissingInputError
    from codeq.schemas import AdapterLink
    from codeq.train.lineage import adapter_sha256, base_lineage, holds_merge

    promoted_policy = load_bench("search_modes").promoted_policy
    config = load_config(
        None, {"policy": {"model": str(tiny_model_dir), "cache_dir": str(tmp_path / "cache")}}
    )
    source = "runs/curve/round-2/adapter"
    shutil.copytree(tiny_adapter_dir, tmp_path / "store" / source)
    link = AdapterLink(round=2, sha256=adapter_sha256(tiny_adapter_dir), source=source)
    candidate = base_lineage(config.policy).extended(link)

    def record(name, lineage, promoted=True):
        path = tmp_path / f"{name}.json"
        body = {"round": 2, "promoted": promoted, "candidate": lineage.model_dump(mode="json")}
        path.write_text(json.dumps(body))
        return path

    lineage, merged = promoted_policy(record("round-2", candidate), tmp_path / "store", config)
    assert lineage == candidate and merged.policy.adapter is None
    assert merged.policy.model.startswith(str(tmp_path / "cache" / "merged"))
    assert holds_merge(Path(merged.policy.model), candidate)
    assert config.policy.model == str(tiny_model_dir)  # the verifier still loads the base

    with pytest.raises(BadInputError, match="kept out by validation"):
        promoted_policy(record("kept-out", candidate, promoted=False), tmp_path / "store", config)
    elsewhere = candidate.model_copy(update={"base_sha256": "0" * 64})
    with pytest.raises(ConfigError, match="builds on"):
        promoted_policy(record("other-base", elsewhere), tmp_path / "store", config)
    retrained = base_lineage(config.policy).extended(link.model_copy(update={"sha256": "1" * 64}))
    with pytest.raises(MissingInputError, match="does not match round 2"):
        promoted_policy(record("retrained", retrained), tmp_path / "store", config)


def test_search_modes_verdict_names_a_winner_only_at_five_points_and_p_below_005():
    verdict = load_bench("search_modes").verdict

    def row(first, solved, bon, gained, lost, p):
        return {
            "first": first,
            "second": "bon@16",
            "candidate_solved": solved,
            "incumbent_solved": bon,
            "gained": ["t"] * gained,
            "lost": ["t"] * lost,
            "p_better": p,
        }

    small = [row("mcts@8", 26, 20, 7, 1, 0.035), row("mt_bon@4x4", 21, 20, 2, 1, 0.5)]
    assert verdict(small, 100, 16).startswith("mcts@8 beats best-of-16 by 6 of 100")
    assert verdict(small, 143, 16).startswith("no search beats best-of-16 by 5 points")
    assert "mcts@8: 26 against 20 (+7 / -1" in verdict(small, 143, 16)
    behind = [row("mcts@8", 18, 24, 1, 7, 0.99), row("mt_bon@4x4", 24, 24, 2, 2, 0.69)]
    assert "sampling is the better search" in verdict(behind, 60, 16)


def test_the_verifier_replaces_the_critique_only_by_the_declared_rule():
    decision = load_bench("verifier_auc").decision

    def search(auc, interval, verifier_solved, critique_solved=20):
        return {
            "verifier": {"within_task": {"auc": auc}, "within_task_interval_95": interval},
            "answers": {
                "trajectories-bon.jsonl": {
                    "verifier_solved": verifier_solved,
                    "critique_solved": critique_solved,
                }
            },
        }

    assert decision(None) is None
    chosen = decision(search(0.66, [0.56, 0.75], 20))
    assert chosen["replaces_critique"]
    assert chosen["settings"] == {"evaluate.tie_break": "verifier", "pairs.q_ai": "verifier"}
    for refused, reason in [
        (search(0.62, [0.48, 0.75], 22), "does not exclude 0.5"),
        (search(0.40, [0.30, 0.49], 22), "does not exclude 0.5"),
        (search(0.66, [0.56, 0.75], 19), "the verifier's answers solve 19, the critique's 20"),
        (search(None, None, 20), "no task holds both"),
    ]:
        kept = decision(refused)
        assert not kept["replaces_critique"]
        assert kept["settings"] == {"evaluate.tie_break": "critique", "pairs.q_ai": "critique"}
        assert any(reason in why for why in kept["why"]), kept["why"]


def test_retest_compares_a_row_task_by_task_with_the_committed_one():
    """bench/retest_single_pass.py's verdict, on the curve's committed 137-task rows: the base
    model's against round 3's differs on the +21 / -7 tasks results.md reports, and a row
    against itself is identical (solved, tokens, no task differing)."""
    from codeq.evaluate import EvalResults

    retest = load_bench("retest_single_pass")
    rows = BENCH.parent / "docs" / "results" / "learning-curve-defaults"
    base = EvalResults.load(rows / "base-test.json")
    round_3 = EvalResults.load(rows / "round-3-test.json")

    found = retest.differences(base, round_3, "zero_shot")
    assert found["solved"] == (24, 38)
    assert len(found["differ"]) == 21 + 7
    assert "DIFFERS" in retest.describe("retest-round-3-1", found)
    same = retest.differences(round_3, round_3, "full_rewrite")
    assert same["differ"] == [] and same["completion_tokens"] == (36338, 36338)
    assert retest.describe("retest-round-3-1", same).endswith("identical")


class CountingVerifier:
    """A stand-in verifier (the wrapper under test only caches and keeps what it is given):
    scores each program by its length and counts what it was asked to score."""

    def __init__(self, verifier_id: str) -> None:
        self.id, self.scored = verifier_id, 0

    def score(self, items: list[tuple[object, str]]) -> list[float]:
        self.scored += len(items)
        return [len(program) / 100 for _, program in items]


def test_search_modes_keeps_the_verifier_s_scores_so_a_resumed_run_scores_nothing_again(
    tmp_path,
) -> None:
    """The test run's verifier scores go to --keep as they are computed, named by the
    verifier's id; a later process reads them instead of scoring again, another verifier never
    reads them, and persisting or restoring the trees leaves them where they are."""
    from test_agreement import add_task

    from codeq.evaluate.run import is_resume_file

    bench = load_bench("search_modes")
    keep, out = tmp_path / "kept", tmp_path / "eval"
    task = add_task()
    items = [(task, "return a + b"), (task, "return b + a"), (task, "return 3")]

    first = CountingVerifier("v1")
    scores = bench.kept_scores(first, keep).score(items)
    assert first.scored == 3 and scores == [0.12, 0.12, 0.08]
    again = CountingVerifier("v1")  # a resumed process: the same verifier, nothing scored
    assert bench.kept_scores(again, keep).score(items) == scores and again.scored == 0
    other = CountingVerifier("v2")  # another verifier's scores are its own
    assert bench.kept_scores(other, keep).score(items[:1]) == [0.12] and other.scored == 1

    out.mkdir()
    (out / "trajectories-bon.partial.jsonl").write_text("{}\n")
    (out / "trajectories-bon.partial.json").write_text('{"key": "k", "seconds": 1}\n')
    bench.persist_trees(out, keep)
    kept = sorted(path.name for path in keep.iterdir())
    assert kept == [
        "trajectories-bon.partial.json.xz",
        "trajectories-bon.partial.jsonl.xz",
        "verifier-v1-scores.jsonl.xz",
        "verifier-v2-scores.jsonl.xz",
    ]
    fresh = tmp_path / "fresh"
    bench.restore_trees(keep, fresh)
    assert sorted(path.name for path in fresh.iterdir()) == [
        "trajectories-bon.partial.json",
        "trajectories-bon.partial.jsonl",
    ]
    assert all(is_resume_file(path.name) for path in fresh.iterdir())


def test_search_modes_keeps_its_trees_at_each_group_edge_and_only_there(tmp_path) -> None:
    """With --keep a run compresses its trees into it whenever a search ends a group of
    search.parallel_trees trees (and at its last tree): a resume searches an unfinished group
    whole again, so those are the copies that save time, and no copy is made in between."""
    from types import SimpleNamespace

    bench = load_bench("search_modes")
    out, keep = tmp_path / "eval", tmp_path / "kept"
    out.mkdir()
    partial = out / "trajectories-bon.partial.jsonl"
    on_tree = bench.persisting_at_group_edges(out, keep, group=4, tasks=10)
    kept_at = []
    for done in range(1, 11):
        partial.write_text("{}\n" * done)
        on_tree(SimpleNamespace(label="bon"))
        copy = keep / "trajectories-bon.partial.jsonl.xz"
        if copy.is_file():
            kept_at.append(lzma.decompress(copy.read_bytes()).count(b"\n"))
            copy.unlink()
    assert kept_at == [4, 8, 10]
