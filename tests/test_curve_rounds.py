"""bench/curve_rounds.py on a real file store with small objects: a round written for git is put
back into a fresh store bit for bit; a tampered file or other settings are refused, naming it."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import curve_rounds  # noqa: E402

from codeq.config import StoreConfig  # noqa: E402
from codeq.errors import CorruptInputError  # noqa: E402
from codeq.store import open_store  # noqa: E402

SETTINGS = {"search": {"seed": 0}, "promotion": {"guard_modes": [], "samples": 0}}


# the third curve's command from its second segment on (promotion on 8 sampled answers from
# round 11); later segments add their options to it
SECOND_SEGMENT = [
    "--out", "/tmp/unused", "--results", "docs/results/learning-curve-defaults",
    "--search-settings", "defaults", "--test-after-chain", "--test-skip", "60",
    "--rounds", "20", "--stop-after-promotions", "2",
    "--promotion-samples", "8", "--promotion-samples-from", "11",
]  # fmt: skip


def assert_committed_rounds_made_with(args, before: int | None = None) -> None:
    """Every committed round of the third curve (before round `before`, where a later segment
    took over) records the settings `args` give that round."""
    import learning_curve

    for path in sorted((REPO / "docs/results/learning-curve-defaults/rounds").glob("*/round.json")):
        record = json.loads(path.read_text())
        if before is not None and record["round"] >= before:
            continue
        now = curve_rounds.effective_settings(
            learning_curve.portable_settings(args, record["round"])
        )
        assert curve_rounds.settings_changes(record["settings"], now) == [], path


def settings_change(args, before: int, after: int) -> list[str]:
    """What `args` change in the settings from round `before` to round `after`."""
    import learning_curve

    return curve_rounds.settings_changes(
        curve_rounds.effective_settings(learning_curve.portable_settings(args, before)),
        curve_rounds.effective_settings(learning_curve.portable_settings(args, after)),
    )


def manifest_of(train: str, report: str) -> bytes:
    """A prepare manifest: its split files' sha256, and report.json's (which holds timings)."""
    files = {"train.jsonl": {"sha256": train * 32}, "report.json": {"sha256": report * 32}}
    return json.dumps({"version": 1, "files": files}).encode()


def store_with_a_round(root: Path):
    store = open_store(StoreConfig(uri=f"file://{root}"))
    trajectories = "".join(
        json.dumps({"task_id": f"t{i}", "code": "x = 1\n" * 50}) + "\n" for i in range(200)
    )
    objects = {
        "runs/curve/round-0/tasks/train.jsonl": b'{"the data set": 1}\n',
        "runs/curve/round-0/tasks/MANIFEST.json": manifest_of(train="aa", report="r1"),
        "runs/curve/round-0/trajectories/shard-0/trajectories.jsonl": trajectories.encode(),
        "runs/curve/round-0/trajectories/shard-0/tasks/t0.json": b"{}\n",
        "runs/curve/round-0/trajectories/shard-0/_COMPLETE": b'{"stage": "collect"}\n',
        "runs/curve-lr/round-0/trajectories/shard-0/trajectories.jsonl": trajectories.encode(),
        "runs/curve-lr/round-0/adapter/adapter_model.safetensors": random.Random(0).randbytes(
            1 << 15
        ),
        "runs/curve-lr/round-0/adapter/_COMPLETE": b'{"stage": "train"}\n',
        "runs/curve-lr/current/CURRENT.json": b'{"adapters": []}\n',
    }
    for key, data in objects.items():
        store.put_bytes(key, data)
    return store, objects


def test_a_round_written_for_git_is_restored_into_a_fresh_store_bit_for_bit(tmp_path):
    store, objects = store_with_a_round(tmp_path / "store")
    results = tmp_path / "results"
    manifest = "runs/curve/round-0/tasks/MANIFEST.json"
    folder = curve_rounds.persist_round(
        store, results, 0, ["curve", "curve-lr"], SETTINGS, manifest
    )
    entry = json.loads((folder / "round.json").read_text())
    assert not [key for key in entry["keys"] if "/tasks/" in key]  # no data set, no progress
    copies = {
        entry["keys"][key]["file"] for key in entry["keys"] if key.endswith("trajectories.jsonl")
    }
    assert len(copies) == 1 and copies.pop().endswith(".jsonl.xz")  # stored once, compressed
    assert curve_rounds.committed_rounds(results) == [0]

    fresh = open_store(StoreConfig(uri=f"file://{tmp_path / 'fresh'}"))
    assert curve_rounds.restore_round(fresh, results, 0, SETTINGS) is True
    for key, data in objects.items():
        if "/tasks/" not in key:
            assert fresh.get_bytes(key) == data
    assert curve_rounds.restore_round(fresh, results, 0, SETTINGS) is False  # held: not again

    fresh.put_bytes("runs/curve-lr/round-0/adapter/adapter_model.safetensors", b"another draw")
    with pytest.raises(CorruptInputError, match="differs from"):
        curve_rounds.restore_round(fresh, results, 0, SETTINGS)


def test_a_tampered_file_or_other_settings_are_refused_naming_the_file(tmp_path):
    store, _ = store_with_a_round(tmp_path / "store")
    results = tmp_path / "results"
    manifest = "runs/curve/round-0/tasks/MANIFEST.json"
    folder = curve_rounds.persist_round(
        store, results, 0, ["curve", "curve-lr"], SETTINGS, manifest
    )

    other = {**SETTINGS, "search": {"seed": 1}}
    with pytest.raises(
        CorruptInputError,
        match=r"round\.json was made with other curve settings.*search\.seed 0 -> 1",
    ):
        curve_rounds.restore_round(
            open_store(StoreConfig(uri=f"file://{tmp_path / 'a'}")), results, 0, other
        )

    adapter = folder / "store/runs/curve-lr/round-0/adapter/adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-1] + b"\0")
    fresh = open_store(StoreConfig(uri=f"file://{tmp_path / 'b'}"))
    with pytest.raises(CorruptInputError, match=f"{adapter} fails its sha256"):
        curve_rounds.restore_round(fresh, results, 0, SETTINGS)
    assert not fresh.list("runs")  # nothing half-restored

    # prepare run again: other timings in report.json are the same tasks; another train split is not
    store.put_bytes(manifest, manifest_of(train="aa", report="r2"))
    curve_rounds.check_tasks(store, results, 0, manifest)
    store.put_bytes(manifest, manifest_of(train="bb", report="r2"))
    with pytest.raises(
        CorruptInputError, match=r"tasks built here differ .*: train\.jsonl \(sha256"
    ):
        curve_rounds.check_tasks(store, results, 0, manifest)


def test_every_committed_round_holds_the_files_its_round_json_lists():
    """What a fresh clone has (a file git ignores would be missing there): each committed
    round's files exist and match their sha256, so a fresh machine can continue from them."""
    rounds = sorted((REPO / "docs" / "results").glob("*/rounds/round-*/round.json"))
    assert rounds, "no committed rounds found"
    for path in rounds:
        entry = json.loads(path.read_text())
        assert set(entry["tasks_sha256"]) == set(curve_rounds.TASK_FILES), path
        for key, recorded in entry["keys"].items():
            curve_rounds.committed_content(path.parent, key, recorded)  # raises if not


def test_the_documented_curve_command_accepts_every_committed_round_of_its_curve():
    """What restore checks on a fresh clone, with today's config: a key added since a round was
    committed must be in NEUTRAL_VALUES at its default, or the committed curve cannot go on."""
    import learning_curve

    command = [
        "--out", "/tmp/unused", "--results", "docs/results/learning-curve-defaults",
        "--search-settings", "defaults", "--test-after-chain", "--test-skip", "60",
        "--rounds", "12", "--stop-after-promotions", "2",
    ]  # fmt: skip
    now = curve_rounds.effective_settings(
        learning_curve.portable_settings(learning_curve.parse_args(command))
    )
    rounds = sorted((REPO / "docs/results/learning-curve-defaults/rounds").glob("*/round.json"))
    assert rounds
    for path in rounds:
        if json.loads(path.read_text())["round"] >= 11:
            continue  # the second segment's, under --promotion-samples (the next test)
        recorded = json.loads(path.read_text())["settings"]
        assert curve_rounds.settings_changes(recorded, now) == [], path


def test_a_chain_going_on_under_the_powered_rule_keeps_its_earlier_rounds_rule():
    """--promotion-samples K from round N: the committed rounds before N were decided by
    greedy McNemar and restore as they are; round N and later record and run with K samples
    (every committed round matches the segment's command, each under its own rule)."""
    import learning_curve

    from codeq.config import load_config

    command = SECOND_SEGMENT
    args = learning_curve.parse_args(command)
    rounds = sorted((REPO / "docs/results/learning-curve-defaults/rounds").glob("*/round.json"))
    assert rounds
    for path in rounds:
        number = json.loads(path.read_text())["round"]
        if number >= 15:
            continue  # the third segment's, under --replay-rounds (the next test)
        now = curve_rounds.effective_settings(learning_curve.portable_settings(args, number))
        recorded = json.loads(path.read_text())["settings"]
        assert curve_rounds.settings_changes(recorded, now) == [], path
    later = learning_curve.round_settings(args, 11)
    assert load_config(None, later).promotion.samples == 8
    assert learning_curve.round_settings(args, 10)["promotion"]["samples"] == 0
    assert settings_change(args, 10, 11) == ["promotion.samples 0 -> 8"]


def test_a_chain_replaying_earlier_pairs_from_a_round_keeps_its_committed_rounds():
    """--replay-rounds K from round N (the third segment): every committed round before N
    restores as it was trained (each round's pairs alone); round N and later train on K earlier
    rounds' pairs too, and the config each round runs with says so."""
    import learning_curve

    from codeq.config import load_config

    command = [*SECOND_SEGMENT, "--replay-rounds", "2", "--replay-from", "15"]
    args = learning_curve.parse_args(command)
    assert_committed_rounds_made_with(args, before=16)  # round 16 on: the fourth segment's
    assert load_config(None, learning_curve.round_settings(args, 15)).train.earlier_rounds == 2
    assert load_config(None, learning_curve.round_settings(args, 14)).train.earlier_rounds == 0
    assert settings_change(args, 14, 15) == ["train.earlier_rounds 0 -> 2"]


def test_a_chain_adding_the_likelihood_term_from_a_round_keeps_its_committed_rounds():
    """--sft-weight W from round N (the fourth segment, from round 16): every committed round
    before N restores as it was trained (DPO alone); round N and later train with the chosen
    programs' likelihood term beside DPO and replay, and the config each round runs with says
    so (the train stage's fingerprint holds train.sft_weight, so no earlier train is reused)."""
    import learning_curve

    from codeq.config import load_config
    from codeq.pipeline.fingerprint import TRAIN_KEYS

    command = [*SECOND_SEGMENT, "--replay-rounds", "2", "--replay-from", "15"]
    command += ["--sft-weight", "1", "--sft-from", "16"]
    args = learning_curve.parse_args(command)
    assert_committed_rounds_made_with(args)
    sixteen = load_config(None, learning_curve.round_settings(args, 16)).train
    assert (sixteen.sft_weight, sixteen.earlier_rounds) == (1.0, 2)
    assert load_config(None, learning_curve.round_settings(args, 15)).train.sft_weight == 0.0
    assert settings_change(args, 15, 16) == ["train.sft_weight 0.0 -> 1.0"]
    assert "train.sft_weight" in TRAIN_KEYS


def test_a_finished_rounds_train_tasks_may_differ_in_content_not_in_which_tasks(tmp_path):
    """Prepare drops a generated hidden test the oracle did not answer in time, so a loaded
    machine builds other train files for the same tasks: the finished round stands, said so."""
    store, _ = store_with_a_round(tmp_path / "store")
    manifest = "runs/curve/round-0/tasks/MANIFEST.json"
    curve_rounds.persist_round(
        store, tmp_path / "results", 0, ["curve", "curve-lr"], SETTINGS, manifest
    )

    same_tasks = "".join(json.dumps({"task_id": f"t{i}", "hidden": [i]}) + "\n" for i in range(200))
    store.put_bytes("runs/curve/round-0/tasks/train.jsonl", same_tasks.encode())
    store.put_bytes(manifest, manifest_of(train="bb", report="r2"))
    note = curve_rounds.check_tasks(store, tmp_path / "results", 0, manifest)
    assert note and "the same 200 tasks: its trees stand as committed" in note

    other_tasks = same_tasks.replace('"t7"', '"t700"')
    store.put_bytes("runs/curve/round-0/tasks/train.jsonl", other_tasks.encode())
    with pytest.raises(CorruptInputError, match=r"train\.jsonl \(sha256 bbbb"):
        curve_rounds.check_tasks(store, tmp_path / "results", 0, manifest)


def test_a_finished_round_made_on_other_held_out_tasks_is_rebuilt_with_round_0s(tmp_path):
    """Prepare that lost an oracle answer dropped a test task and reordered the test split
    (round 8 of the third curve): a fresh machine builds round 0's test tasks for it, as every
    new round must, and the round stands as committed (one under way goes on with them); any
    other test file is refused, and so
    is a round under way whose held-out tasks moved elsewhere than to round 0's."""
    store, _ = store_with_a_round(tmp_path / "store")
    results = tmp_path / "results"

    def prepared(number: int, test: str) -> str:
        manifest = f"runs/curve/round-{number}/tasks/MANIFEST.json"
        files = {"train.jsonl": {"sha256": "aa" * 32}, "test.jsonl": {"sha256": test * 32}}
        store.put_bytes(manifest, json.dumps({"version": 1, "files": files}).encode())
        return manifest

    curve_rounds.persist_round(store, results, 0, ["curve"], SETTINGS, prepared(0, "c0"))
    curve_rounds.persist_round(store, results, 1, ["curve"], SETTINGS, prepared(1, "d1"))

    note = curve_rounds.check_tasks(store, results, 1, prepared(1, "c0"))
    assert note and "round 1 was made on other test.jsonl tasks than round 0's" in note
    with pytest.raises(CorruptInputError, match=r"test\.jsonl \(sha256 e2e2e2e2e2e2 here"):
        curve_rounds.check_tasks(store, results, 1, prepared(1, "e2"))
    with pytest.raises(CorruptInputError, match=r"test\.jsonl \(sha256 d1d1"):
        curve_rounds.check_tasks(store, results, 0, prepared(0, "d1"))  # round 0 itself

    # a round under way goes on with round 0's test tasks (its evaluation searches them);
    # any other test file is still refused
    finished = curve_rounds.finished_record(results, 1)
    partial = curve_rounds.partial_folder(results, 1) / curve_rounds.PARTIAL_FILE
    partial.parent.mkdir(parents=True)
    finished.rename(partial)
    note = curve_rounds.check_tasks(store, results, 1, prepared(1, "c0"))
    assert note and "round 1's partial copy was made on other test.jsonl tasks" in note
    assert "its evaluation goes on with them" in note
    with pytest.raises(CorruptInputError, match=r"partial\.json was made with: test\.jsonl"):
        curve_rounds.check_tasks(store, results, 1, prepared(1, "e2"))


def store_with_a_round_under_way(root: Path):
    """Round 1 of run `curve`: prepared, its collect stopped after two tasks, no train yet,
    and an evaluation's saved tree (as a later stop would leave)."""
    store = open_store(StoreConfig(uri=f"file://{root}"))
    prefix = "runs/curve/round-1"
    train = b'{"task_id": "t0"}\n{"task_id": "t1"}\n{"task_id": "t2"}\n'
    report = b'{"seconds": 50.1}\n'
    objects = {
        f"{prefix}/tasks/train.jsonl": train,
        f"{prefix}/tasks/report.json": report,
        f"{prefix}/tasks/MANIFEST.json": manifest_of(train="aa", report="r1"),
        f"{prefix}/tasks/_COMPLETE": b'{"stage": "prepare"}\n',
        f"{prefix}/trajectories/shard-0/PROGRESS.json": b'{"fingerprint": "f1"}\n',
        f"{prefix}/trajectories/shard-0/tasks/t0.json": b'{"task_id": "t0"}\n',
        f"{prefix}/trajectories/shard-0/tasks/t1.json": b'{"task_id": "t1"}\n',
        f"{prefix}/train-progress/checkpoint.bin": random.Random(1).randbytes(1 << 15),
        f"{prefix}/eval-progress/candidate/validation/full_rewrite/trees/t5.json": b"{}\n",
        f"{prefix}/eval-progress/candidate/validation/full_rewrite/STATE.json": b'{"s": 9.5}\n',
    }
    for key, data in objects.items():
        store.put_bytes(key, data)
    return store, objects


def test_a_round_under_way_is_copied_for_git_and_goes_on_in_a_fresh_store(tmp_path):
    store, objects = store_with_a_round_under_way(tmp_path / "store")
    results = tmp_path / "results"
    manifest = "runs/curve/round-1/tasks/MANIFEST.json"
    record = curve_rounds.persist_partial(store, results, 1, ["curve"], SETTINGS, manifest)
    folder = curve_rounds.partial_folder(results, 1)
    listed = json.loads((folder / curve_rounds.PARTIAL_FILE).read_text())["keys"]
    assert record["keys"] == listed
    assert sorted(key.removeprefix("runs/curve/round-1/") for key in listed) == [
        "eval-progress/candidate/validation/full_rewrite/STATE.json",
        "eval-progress/candidate/validation/full_rewrite/trees/t5.json",  # hours of searching
        "tasks/MANIFEST.json",  # prepare's record, not the data set
        "tasks/report.json",
        "trajectories/shard-0/PROGRESS.json",
        "trajectories/shard-0/tasks/t0.json",
        "trajectories/shard-0/tasks/t1.json",
    ]  # train-progress holds no complete checkpoint (no LATEST.json names one): none copied
    assert curve_rounds.partial_rounds(results) == [1]

    # the same store went on after the copy was made: another tree saved, the state rewritten
    evaluation = "runs/curve/round-1/eval-progress/candidate/validation/full_rewrite"
    store.put_bytes(f"{evaluation}/trees/t6.json", b"{}\n")
    store.put_bytes(f"{evaluation}/STATE.json", b'{"s": 20.25}\n')
    assert curve_rounds.restore_partial(store, results, 1, SETTINGS) == 0
    assert store.get_bytes(f"{evaluation}/STATE.json") == b'{"s": 20.25}\n'  # its own stands

    fresh = open_store(StoreConfig(uri=f"file://{tmp_path / 'fresh'}"))
    assert curve_rounds.restore_partial(fresh, results, 1, SETTINGS) == 5
    assert not fresh.exists(manifest)  # prepare builds the tasks on this machine first
    assert (
        fresh.get_bytes("runs/curve/round-1/trajectories/shard-0/tasks/t1.json")
        == (objects["runs/curve/round-1/trajectories/shard-0/tasks/t1.json"])
    )
    # this machine's prepare: the same split files, its own timings in report.json
    fresh.put_bytes(
        "runs/curve/round-1/tasks/train.jsonl", objects["runs/curve/round-1/tasks/train.jsonl"]
    )
    fresh.put_bytes("runs/curve/round-1/tasks/report.json", b'{"seconds": 80.3}\n')
    fresh.put_bytes(manifest, manifest_of(train="aa", report="r9"))
    assert curve_rounds.check_tasks(fresh, results, 1, manifest) is None
    assert curve_rounds.adopt_prepare_report(fresh, results, 1, manifest)
    assert fresh.get_bytes(manifest) == objects[manifest]  # what the saved progress was made with
    assert fresh.get_bytes("runs/curve/round-1/tasks/report.json") == b'{"seconds": 50.1}\n'

    other = open_store(StoreConfig(uri=f"file://{tmp_path / 'other'}"))
    other.put_bytes(manifest, manifest_of(train="cc", report="r9"))
    with pytest.raises(CorruptInputError, match=r"train\.jsonl \(sha256 cccc") as refused:
        curve_rounds.check_tasks(other, results, 1, manifest)
    assert "delete" in refused.value.hint and "round-1-partial" in refused.value.hint
    other.put_bytes(
        "runs/curve/round-1/trajectories/shard-0/PROGRESS.json", b'{"fingerprint": "f2"}\n'
    )
    with pytest.raises(CorruptInputError, match=r"PROGRESS\.json differs"):
        curve_rounds.restore_partial(other, results, 1, SETTINGS)

    store.put_bytes("runs/curve/round-1/adapter/_COMPLETE", b'{"stage": "train"}\n')
    curve_rounds.persist_round(store, results, 1, ["curve"], SETTINGS, manifest)
    assert not folder.exists() and curve_rounds.partial_rounds(results) == []
    with pytest.raises(Exception, match="finished and committed already"):
        curve_rounds.persist_partial(store, results, 1, ["curve"], SETTINGS, manifest)


def test_a_stopped_trains_last_checkpoint_goes_to_git_and_resumes_only_where_none_is_newer(
    tmp_path,
):
    """A train stopped after its step-4 checkpoint (step 6's upload cut before LATEST named
    it): the copy holds LATEST and step 4's files; a fresh store gets them and resumes there; a
    store with a checkpoint of its own, or whose train finished, keeps what it has."""
    from codeq.train.checkpoints import download_latest, latest

    store, _ = store_with_a_round_under_way(tmp_path / "store")
    progress = "runs/curve/round-1/train-progress/"
    written = tmp_path / "checkpoint-4"
    written.mkdir()
    (written / "adapter_model.safetensors").write_bytes(random.Random(4).randbytes(1 << 15))
    (written / "optimizer.pt").write_bytes(random.Random(5).randbytes(1 << 15))
    (written / "trainer_state.json").write_bytes(b'{"global_step": 4}\n')
    store.put_dir(f"{progress}checkpoint-4", written)  # as the trainer's upload: manifest last
    step_4 = {key: store.get_bytes(key) for key in store.list(f"{progress}checkpoint-4")}
    assert len(step_4) == 4  # the three files and their MANIFEST.json
    store.put_bytes(f"{progress}checkpoint-6/optimizer.pt", b"cut short")
    store.put_json(f"{progress}LATEST.json", {"step": 4, "fingerprint": {"sha256": "f"}})
    results = tmp_path / "results"
    manifest = "runs/curve/round-1/tasks/MANIFEST.json"

    record = curve_rounds.persist_partial(
        store, results, 1, ["curve"], SETTINGS, manifest, with_checkpoint=True
    )

    copied = sorted(key for key in record["keys"] if key.startswith(progress))
    assert copied == sorted([f"{progress}LATEST.json", *step_4])
    fresh = open_store(StoreConfig(uri=f"file://{tmp_path / 'fresh'}"))
    curve_rounds.restore_partial(fresh, results, 1, SETTINGS)
    assert latest(fresh, progress.rstrip("/"))["step"] == 4
    for key, data in step_4.items():
        assert fresh.get_bytes(key) == data
    assert not fresh.exists(f"{progress}checkpoint-6/optimizer.pt")

    went_on = open_store(StoreConfig(uri=f"file://{tmp_path / 'went-on'}"))
    went_on.put_bytes(f"{progress}checkpoint-8/optimizer.pt", b"step 8")
    went_on.put_json(f"{progress}LATEST.json", {"step": 8, "fingerprint": {"sha256": "f"}})
    curve_rounds.restore_partial(went_on, results, 1, SETTINGS)  # no refusal: its own is newer
    assert latest(went_on, progress.rstrip("/"))["step"] == 8
    assert not went_on.list(f"{progress}checkpoint-4")

    finished = open_store(StoreConfig(uri=f"file://{tmp_path / 'finished'}"))
    finished.put_bytes("runs/curve/round-1/adapter/_COMPLETE", b'{"stage": "train"}\n')
    curve_rounds.restore_partial(finished, results, 1, SETTINGS)
    assert not finished.list(progress)  # spent: never copied into the finished round
    without = curve_rounds.persist_partial(store, results, 1, ["curve"], SETTINGS, manifest)
    assert not [key for key in without["keys"] if key.startswith(progress)]  # asked for only
    curve_rounds.persist_partial(
        store, results, 1, ["curve"], SETTINGS, manifest, with_checkpoint=True
    )
    download_latest(fresh, progress.rstrip("/"), tmp_path / "resume")
    assert (tmp_path / "resume/checkpoint-4/optimizer.pt").read_bytes() == step_4[
        f"{progress}checkpoint-4/optimizer.pt"
    ]


def test_a_committed_round_whose_tasks_came_out_other_is_prepared_again_then_refused(tmp_path):
    """A loaded machine's prepare built other files than a round under way recorded (a CI run:
    round 1's validation file for a fresh store): prepared again, said so, and accepted once it
    builds the recorded ones; a round whose prepare never does is refused after three tries."""
    store, _ = store_with_a_round_under_way(tmp_path / "store")
    results = tmp_path / "results"
    manifest = "runs/curve/round-1/tasks/MANIFEST.json"
    curve_rounds.persist_partial(store, results, 1, ["curve"], SETTINGS, manifest)

    fresh = open_store(StoreConfig(uri=f"file://{tmp_path / 'fresh'}"))
    builds = iter(["cc", "aa"])  # what preparing again builds, in turn
    fresh.put_bytes(manifest, manifest_of(train="bb", report="r9"))

    def prepare_again() -> None:
        fresh.put_bytes(manifest, manifest_of(train=next(builds), report="r9"))

    said: list[str] = []
    note = curve_rounds.check_tasks_preparing_again(
        fresh, results, 1, manifest, prepare_again, said.append
    )
    assert note is None and next(builds, None) is None  # the third build was the recorded one
    assert len(said) == 2 and "train.jsonl (sha256 bbbb" in said[0]
    assert said[1].endswith("preparing again (attempt 3 of 3)")

    builds = iter(["cc", "dd"])
    fresh.put_bytes(manifest, manifest_of(train="bb", report="r9"))
    with pytest.raises(CorruptInputError, match=r"train\.jsonl \(sha256 dddd"):
        curve_rounds.check_tasks_preparing_again(fresh, results, 1, manifest, prepare_again, print)


def test_a_new_rounds_held_out_tasks_are_prepared_again_until_they_are_round_0s(tmp_path):
    """A loaded machine's prepare can drop a task from test (its bug caught only by a hidden test
    the oracle answered too late), and the split's shuffle then reorders the rest: a new round
    prepares again until its validation and test tasks are round 0's, else it is refused."""
    store = open_store(StoreConfig(uri=f"file://{tmp_path / 'store'}"))
    results = tmp_path / "results"

    def put_tasks(folder: str, validation: list[str], test: list[str], hidden: int = 0) -> None:
        for name, ids in (("validation", validation), ("test", test)):
            lines = [json.dumps({"task_id": i, "hidden": [hidden]}) + "\n" for i in ids]
            store.put_bytes(f"{folder}/{name}.jsonl", "".join(lines).encode())

    first, tasks = "runs/curve/round-0/tasks", "runs/curve/round-1/tasks"
    put_tasks(first, ["v1", "v2"], ["t1", "t2", "t3"])
    put_tasks(tasks, ["v1", "v2"], ["t3", "t1"])  # t2 dropped, the rest shuffled anew
    builds = iter([(["v1", "v2"], ["t1", "t2", "t3"])])  # what preparing again builds, in turn

    def prepare_again() -> None:
        validation, test = next(builds)
        put_tasks(tasks, validation, test, hidden=1)  # other hidden tests: the same tasks

    notes = list(
        curve_rounds.prepare_held_out_alike(store, results, 1, (first, tasks), prepare_again)
    )
    assert notes == [
        "round 1: prepare built other tasks in test.jsonl than round 0; preparing again "
        "(attempt 2 of 3)"
    ]
    assert curve_rounds.held_out_differences(store, first, tasks) == []

    put_tasks(tasks, ["v2", "v1"], ["t1", "t3"])
    builds = iter([(["v2", "v1"], ["t1", "t3"])] * 2)
    with pytest.raises(CorruptInputError, match="validation.jsonl and test.jsonl than round 0"):
        list(curve_rounds.prepare_held_out_alike(store, results, 1, (first, tasks), prepare_again))

    def never() -> None:
        raise AssertionError("a round in git is held to its own record, never prepared again")

    (curve_rounds.partial_folder(results, 1)).mkdir(parents=True)
    (curve_rounds.partial_folder(results, 1) / curve_rounds.PARTIAL_FILE).write_text("{}")
    assert not list(curve_rounds.prepare_held_out_alike(store, results, 1, (first, tasks), never))


def test_files_gitignore_leaves_out_are_named_before_a_commit_silently_lacks_them(tmp_path):
    """`*.safetensors` once kept the trained verifier out of a commit without a word."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing is ignored")
    kept = REPO / "docs" / "results" / "verifier" / "some-run"
    adapter = kept / "verifier" / "adapter_model.safetensors"  # .gitignore makes an exception
    stray = kept / "adapter_model.safetensors"
    assert curve_rounds.ignored_by_git([kept / "KEPT.json", adapter, stray]) == [stray]
    assert curve_rounds.ignored_by_git([tmp_path / "a.safetensors"]) == []  # outside the checkout


def test_relative_paths_are_read_from_the_working_folder(monkeypatch):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing is ignored")
    monkeypatch.chdir(REPO)
    adapter = Path("docs/results/verifier/some-run/verifier/adapter_model.safetensors")
    stray = Path("docs/results/verifier/some-run/adapter_model.safetensors")
    assert curve_rounds.ignored_by_git([adapter, stray]) == [stray]


def test_saved_evaluation_trees_stand_where_only_the_train_file_was_built_otherwise(tmp_path):
    """Another machine's prepare set other per-call limits in the train file (the same tasks)
    but built the same validation and test files: the saved evaluation trees of a round under
    way stand, their record carried to this machine's tasks manifest; other held-out files
    leave the record as it was, for the evaluate stage to refuse."""
    import hashlib

    from codeq.pipeline.fingerprint import Fingerprint

    def manifest(train: str, validation: str) -> bytes:
        files = {name: {"sha256": value * 32} for name, value in [("train.jsonl", train)]}
        files["validation.jsonl"] = {"sha256": validation * 32}
        return json.dumps({"version": 1, "files": files}).encode()

    store, _ = store_with_a_round_under_way(tmp_path / "store")
    key = "runs/curve/round-1/tasks/MANIFEST.json"
    store.put_bytes(key, manifest(train="aa", validation="vv"))
    searched_with = hashlib.sha256(manifest(train="aa", validation="vv")).hexdigest()
    progress = "runs/curve/round-1/eval-progress/PROGRESS.json"
    inputs = {"adapter": "ad" * 32, "tasks": searched_with}
    store.put_json(progress, {"fingerprint": Fingerprint({"x": 1}, inputs).to_json()})
    results = tmp_path / "results"
    curve_rounds.persist_partial(store, results, 1, ["curve"], SETTINGS, key)

    fresh = open_store(StoreConfig(uri=f"file://{tmp_path / 'fresh'}"))
    curve_rounds.restore_partial(fresh, results, 1, SETTINGS)
    fresh.put_bytes(key, manifest(train="bb", validation="vv"))
    note = curve_rounds.carry_eval_progress(fresh, results, 1, key)
    assert note and "eval-progress/PROGRESS.json" in note
    carried = fresh.get_json(progress)["fingerprint"]
    built_here = hashlib.sha256(manifest(train="bb", validation="vv")).hexdigest()
    assert carried["inputs"] == {"adapter": "ad" * 32, "tasks": built_here}
    assert carried["sha256"] == Fingerprint({"x": 1}, carried["inputs"]).sha256
    curve_rounds.restore_partial(fresh, results, 1, SETTINGS)  # the carried record is accepted
    assert curve_rounds.carry_eval_progress(fresh, results, 1, key) is None  # carried already

    other = open_store(StoreConfig(uri=f"file://{tmp_path / 'other'}"))
    curve_rounds.restore_partial(other, results, 1, SETTINGS)
    other.put_bytes(key, manifest(train="bb", validation="ww"))
    assert curve_rounds.carry_eval_progress(other, results, 1, key) is None
    assert other.get_json(progress)["fingerprint"]["inputs"]["tasks"] == searched_with


def test_a_round_under_way_saved_on_another_test_file_searches_its_test_trees_again(tmp_path):
    """Round 14 of the third curve: its partial copy's prepare (on a loaded machine) built
    another test file than round 0's, a fresh machine builds round 0's. The saved validation
    trees stand, carried to this machine's manifest; those saved on the test file are deleted
    and searched again; a test file that is not round 0's leaves everything for evaluate."""
    import hashlib

    from codeq.pipeline.fingerprint import Fingerprint

    def manifest(test: str) -> bytes:
        files = {"train.jsonl": {"sha256": "aa" * 32}, "validation.jsonl": {"sha256": "vv" * 32}}
        files["test.jsonl"] = {"sha256": test * 32}
        return json.dumps({"version": 1, "files": files}).encode()

    results = tmp_path / "results"
    store, _ = store_with_a_round(tmp_path / "round0")
    round0 = "runs/curve/round-0/tasks/MANIFEST.json"
    store.put_bytes(round0, manifest(test="c0"))
    curve_rounds.persist_round(store, results, 0, ["curve"], SETTINGS, round0)

    store, _ = store_with_a_round_under_way(tmp_path / "store")
    key = "runs/curve/round-1/tasks/MANIFEST.json"
    store.put_bytes(key, manifest(test="d1"))  # the loaded machine's test file
    progress = "runs/curve/round-1/eval-progress/PROGRESS.json"
    inputs = {"tasks": hashlib.sha256(manifest(test="d1")).hexdigest()}
    store.put_json(progress, {"fingerprint": Fingerprint({"x": 1}, inputs).to_json()})
    on_test = "runs/curve/round-1/eval-progress/candidate/test/full_rewrite/trees/t9.json"
    store.put_bytes(on_test, b"{}\n")
    curve_rounds.persist_partial(store, results, 1, ["curve"], SETTINGS, key)

    other = open_store(StoreConfig(uri=f"file://{tmp_path / 'other'}"))
    curve_rounds.restore_partial(other, results, 1, SETTINGS)
    other.put_bytes(key, manifest(test="e2"))  # neither recorded nor round 0's
    assert curve_rounds.carry_eval_progress(other, results, 1, key) is None
    assert other.exists(on_test)

    fresh = open_store(StoreConfig(uri=f"file://{tmp_path / 'fresh'}"))
    curve_rounds.restore_partial(fresh, results, 1, SETTINGS)
    fresh.put_bytes(key, manifest(test="c0"))  # round 0's
    assert "its evaluation goes on" in curve_rounds.check_tasks(fresh, results, 1, key)
    note = curve_rounds.carry_eval_progress(fresh, results, 1, key)
    assert note and "other test.jsonl than its record" in note
    assert "objects it saved on test.jsonl are deleted" in note
    assert not fresh.exists(on_test)
    kept = "runs/curve/round-1/eval-progress/candidate/validation/full_rewrite/trees/t5.json"
    assert fresh.exists(kept)
    carried = fresh.get_json(progress)["fingerprint"]["inputs"]
    assert carried == {"tasks": hashlib.sha256(manifest(test="c0")).hexdigest()}
