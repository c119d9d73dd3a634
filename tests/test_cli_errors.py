"""The first hour's bad inputs: each is one `error:` line, a `hint:` and a non-zero exit, and
long waits say what they wait for."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_store_helpers import BUCKET, S3_ENV, free_port

from codeq.cli import run
from codeq.errors import EXIT_BAD_INPUT, EXIT_STAGE_FAILED, EXIT_TRANSIENT
from codeq.schemas import ChatMessage, Node, Pair, Trajectory, write_jsonl

REPO = Path(__file__).resolve().parent.parent


def error_and_hint(err: str) -> tuple[str, str]:
    """The error and hint lines of stderr; exactly one of each."""
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    hints = [line for line in err.splitlines() if line.startswith("hint: ")]
    assert len(errors) == 1 and len(hints) == 1, err[-2000:]
    assert "Traceback" not in err
    return errors[0], hints[0]


def one_pair(path: Path) -> Path:
    prompt = [ChatMessage(role="user", content="Fix f")]
    pair = Pair(
        task_id="t",
        slug="t",
        level="easy",
        category="logic",
        prompt=prompt,
        chosen="```python\ndef f(a):\n    return a + 1\n```",
        rejected="```python\nf = 1\n```",
        q_chosen=1.0,
        q_rejected=0.0,
    )
    write_jsonl(path / "pairs.jsonl", [pair])
    return path


@pytest.mark.parametrize("model", ["./models/nope", "models/a/b", "~/no/such.gguf"])
def test_train_with_a_missing_model_path(tmp_path, capsys, model):
    pairs = one_pair(tmp_path / "pairs")
    code = run(["train", str(pairs), "--model", model, "--out", str(tmp_path / "t")])
    assert code == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert "does not exist" in error and model in error
    assert "Repo id" not in error and "smollm2" in hint


def test_merge_with_a_missing_model_path(tmp_path, capsys):
    code = run(["merge", str(tmp_path / "adapter"), "--model", "./base", "-o", str(tmp_path / "m")])
    assert code == EXIT_BAD_INPUT
    error, _ = error_and_hint(capsys.readouterr().err)
    assert error == "error: model path ./base does not exist"


def test_a_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    pairs = one_pair(tmp_path / "pairs")
    assert run(["train", str(pairs), "--model", str(tmp_path / "empty")]) == EXIT_BAD_INPUT
    error, _ = error_and_hint(capsys.readouterr().err)
    assert "is not a model folder (no config.json)" in error


@pytest.mark.parametrize("command", ["round", "rounds"])
def test_round_with_a_missing_model_fails_before_any_stage(tmp_path, capsys, command):
    out = tmp_path / "run"
    argv = [command, "--model", str(tmp_path / "mine.gguf"), "-o", str(out)]
    argv += ["--rounds", "2"] if command == "rounds" else []
    assert run(argv) == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert error == f"error: model file {tmp_path / 'mine.gguf'} does not exist"
    assert "smollm2" in hint
    assert not out.exists(), "nothing is started (no store, no prepared tasks)"


# ------------------------------------------------------------------------------ settings


def test_unknown_preset(capsys):
    assert run(["--preset", "laptp", "config"]) == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert error == "error: unknown preset 'laptp'"
    assert hint.startswith("hint: did you mean laptop?") and "production" in hint


def test_unknown_preset_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("CODEQ_PRESET", "prod")
    assert run(["round", "-o", "/nonexistent/never-created"]) == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert error == "error: unknown preset 'prod'" and "production" in hint


def test_missing_config_file(tmp_path, capsys):
    assert run(["-c", str(tmp_path / "mine.yaml"), "config"]) == EXIT_BAD_INPUT
    error, _ = error_and_hint(capsys.readouterr().err)
    assert error == f"error: config file not found: {tmp_path / 'mine.yaml'}"


def test_config_file_that_is_a_list(tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text("- search\n- rollouts\n")
    assert run(["config", "-c", str(path)]) == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert "must hold a mapping of sections, not list" in error and "search:" in hint


def test_bad_value_from_a_flag(tmp_path, capsys):
    """A value the option's own type accepts but the config key does not."""
    code = run(["prepare", "--source", "builtin", "--test-fraction", "1.5", "-o", str(tmp_path)])
    assert code == EXIT_BAD_INPUT
    error, _ = error_and_hint(capsys.readouterr().err)
    assert error.startswith("error: invalid config: tasks.test_fraction: ")
    assert error.endswith("from a command-line flag")


def test_unknown_option_names_the_command_help(capsys):
    assert run(["collect", "--rolouts", "3"]) == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert "No such option: --rolouts" in error and "--rollouts" in error
    assert hint == "hint: run `codeq collect --help` for usage"


# ------------------------------------------------------------------------------ tasks


def test_missing_task_source(tmp_path, capsys):
    missing = tmp_path / "debugbench"
    assert run(["prepare", "--source", str(missing), "-o", str(tmp_path / "t")]) == 2
    error, hint = error_and_hint(capsys.readouterr().err)
    assert error == f"error: task source {str(missing)!r} does not exist"
    assert "DebugBench clone" in hint and "builtin" in hint


def test_an_empty_task_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = run(["prepare", "--source", str(tmp_path / "empty"), "-o", str(tmp_path / "t")])
    assert code == EXIT_BAD_INPUT
    error, _ = error_and_hint(capsys.readouterr().err)
    assert "no python3_" in error


@pytest.fixture
def unreachable_hub(monkeypatch):
    """The Hugging Face hub at a closed local port: every request fails to connect at once."""
    from huggingface_hub import constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    return endpoint


def test_a_hub_id_on_an_unreachable_hub_is_transient_and_says_it_was_read_as_an_id(
    tmp_path, monkeypatch, capsys, unreachable_hub
):
    """`--source data/debugbench` with no such folder here or nearby is spelt like a hub id;
    with the hub unreachable a retry may fix it (exit 75), and the hint says how it was read."""
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    code = run(["prepare", "--source", "data/debugbench", "-o", str(tmp_path / "t")])
    assert code == EXIT_TRANSIENT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert error.startswith("error: cannot reach the Hugging Face hub for 'data/debugbench'")
    assert "there is no local folder 'data/debugbench'" in hint


@pytest.mark.parametrize("command", ["prepare", "round"])
def test_a_mistyped_folder_is_bad_input_at_once_with_did_you_mean(
    tmp_path, monkeypatch, capsys, unreachable_hub, command
):
    """The README's `--source ../shared/debugbench` typed as `data/debugbench`: a folder of
    that name lies next door, so it is a mistyped path (exit 2 and where it is), not a hub id to
    retry for half a minute (exit 75)."""
    (tmp_path / "shared" / "debugbench").mkdir(parents=True)
    (tmp_path / "main").mkdir()
    monkeypatch.chdir(tmp_path / "main")
    code = run([command, "--source", "data/debugbench", "-o", str(tmp_path / "t")])
    assert code == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert "'data/debugbench' is no local folder" in error
    assert hint.startswith("hint: did you mean ../shared/debugbench?")


@pytest.mark.parametrize(
    ("source", "error", "suggestion"),
    [
        (
            "bultin",
            "error: unknown task source 'bultin': no such folder, and not 'builtin'",
            "builtin",
        ),
        (
            "Builtin",
            "error: unknown task source 'Builtin': no such folder, and not 'builtin'",
            "builtin",
        ),
        (
            "./tasks/debugbnch",
            "error: task source './tasks/debugbnch' does not exist",
            "tasks/debugbench",
        ),
    ],
)
def test_a_near_miss_of_builtin_or_a_path_stops_the_round_before_any_stage(
    tmp_path, monkeypatch, capsys, source, error, suggestion
):
    (tmp_path / "tasks" / "debugbench").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    assert run(["round", "--source", source, "-o", str(out)]) == EXIT_BAD_INPUT
    found, hint = error_and_hint(capsys.readouterr().err)
    assert found == error
    assert hint.startswith(f"hint: did you mean {suggestion}?")
    assert not out.exists(), "nothing is started (no store, no prepared tasks)"


def test_a_folder_typo_spelt_like_a_hub_id_names_the_close_folder(
    tmp_path, monkeypatch, capsys, unreachable_hub
):
    """`tasks/debugbnch` may be a hub dataset; the hub cannot be reached, and `tasks/` holds
    `debugbench`: a mistyped folder (exit 2), not a hub id to retry."""
    (tmp_path / "tasks" / "debugbench").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    code = run(["prepare", "--source", "tasks/debugbnch", "-o", str(tmp_path / "t")])
    assert code == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert "'tasks/debugbnch' is no local folder" in error
    assert hint.startswith("hint: did you mean tasks/debugbench?")


@pytest.mark.parametrize("model", ["smolm2", "SmolLM2", "smollm-2", "smollm"])
def test_a_near_miss_of_smollm2_stops_the_round_before_any_stage(tmp_path, capsys, model):
    out = tmp_path / "run"
    assert run(["round", "--model", model, "-o", str(out)]) == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert error == f"error: unknown model {model!r}: no such folder or file, and not 'smollm2'"
    assert hint.startswith("hint: did you mean smollm2?")
    assert not out.exists()


def test_a_mistyped_model_path_names_the_close_one(tmp_path, monkeypatch, capsys):
    (tmp_path / "models" / "smollm2-135m").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    code = run(["round", "--model", "./models/smollm2-135", "-o", str(tmp_path / "run")])
    assert code == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert error == "error: model path ./models/smollm2-135 does not exist"
    assert hint.startswith("hint: did you mean models/smollm2-135m?")


def trajectory(task_id: str, values: tuple[float, float]) -> Trajectory:
    prompt = [ChatMessage(role="user", content=f"Fix {task_id}")]
    nodes = [Node(id=0, parent=None, depth=0, program="x = 0")] + [
        Node(
            id=i,
            parent=0,
            depth=1,
            rollout=1,
            prompt=prompt,
            completion=f"```python\nx = {i}\n```",
            program=f"x = {i}",
            q_mcts=q,
            q_ai=q,
        )
        for i, q in enumerate(values, start=1)
    ]
    return Trajectory(
        task_id=task_id,
        slug=task_id,
        level="easy",
        category="logic",
        subtype="operation error",
        mode="mcts",
        reward_tests="all",
        nodes=nodes,
        solved=False,
        first_pass_node=None,
        final_node=1,
    )


def test_pairs_on_empty_trajectories_fails_at_pairs(tmp_path, capsys):
    (tmp_path / "traj").mkdir()
    (tmp_path / "traj" / "trajectories.jsonl").write_text("")
    assert run(["pairs", str(tmp_path / "traj"), "-o", str(tmp_path / "p")]) == EXIT_BAD_INPUT
    error, hint = error_and_hint(capsys.readouterr().err)
    assert "no trajectories in" in error and "codeq collect" in hint


def test_pairs_that_yield_no_pairs_fail_at_pairs(tmp_path, capsys):
    write_jsonl(tmp_path / "traj" / "trajectories.jsonl", [trajectory("t", (0.5, 0.5))])
    assert run(["pairs", str(tmp_path / "traj"), "-o", str(tmp_path / "p")]) == EXIT_STAGE_FAILED
    error, hint = error_and_hint(capsys.readouterr().err)
    assert "no preference pairs from 1 trajectories" in error and "small_gap" in error
    assert "--min-value-gap" in hint
    assert (tmp_path / "p" / "stats.json").is_file()  # the drop counts stay readable


def test_unreachable_s3_says_what_it_waits_for_and_gives_up_in_bounded_time(monkeypatch, capsys):
    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CODEQ_STORE__ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("CODEQ_STORE__MAX_ATTEMPTS", "3")
    monkeypatch.setenv("CODEQ_STORE__CONNECT_TIMEOUT_S", "1")
    started = time.perf_counter()
    assert run(["promote", "--store", f"s3://{BUCKET}/nowhere"]) == EXIT_TRANSIENT
    assert time.perf_counter() - started < 30
    err = capsys.readouterr().err
    error, hint = error_and_hint(err)
    assert "no S3 endpoint answers at http://127.0.0.1:" in error and "3 attempts" in error
    assert "store.endpoint_url" in hint and "store.max_attempts" in hint
    waiting = [line for line in err.splitlines() if "retrying" in line]
    assert len(waiting) == 1 and " INFO codeq: store: S3 at http://127.0.0.1:" in waiting[0]
    assert err.index(waiting[0]) < err.index(error)


def test_importing_the_training_stack_prints_no_bitsandbytes_notice():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", "import codeq, peft, trl"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "kernels-community" not in result.stderr


def test_the_bitsandbytes_filter_drops_only_the_kernels_notice(caplog):
    import codeq  # noqa: F401 - installs the filter

    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s.", "x")
        logger.warning("a real bitsandbytes problem")
    assert [r.getMessage() for r in caplog.records] == ["a real bitsandbytes problem"]


def test_model_loading_says_what_it_waits_for(tiny_model_dir, caplog):
    from codeq.config import PolicyConfig
    from codeq.policy import PolicyEngine

    with caplog.at_level(logging.INFO, logger="codeq.policy.source"):
        PolicyEngine.load(PolicyConfig(model=str(tiny_model_dir)))
    assert f"loading policy from {tiny_model_dir}" in caplog.text
