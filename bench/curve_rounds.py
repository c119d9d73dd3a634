"""A learning curve's finished rounds, kept in git: what a fresh machine needs to go on from them
and what anyone needs to check them.

`persist_round` copies a finished round's store objects (trajectories, pairs, adapter, evaluation
with its searched trees, promotion decision, report, and the run's current policy after the
round) into `<results>/rounds/round-N/`: every object under `store/<its key>`, compressed with
xz (`<key>.xz`) where that saves a tenth or more, an object equal to one already copied stored
once, and `round.json` listing each key with the sha256 and size of its content. The tasks (DebugBench
itself) are left out: the curve's prepare stage builds them again, and `round.json` records the
sha256 of each split file, so tasks that came out different are caught (prepare's report.json is
not compared: it carries the times prepare took).

`restore_rounds` puts committed rounds back into an empty store before the curve runs, so it
continues after them instead of computing them again. A file whose content fails its sha256, or
a round made with other curve settings, is refused with one line naming the file; a round the
store already holds must hold the committed content, never be overwritten.

A round takes longer than a session's machine may live (collect alone about 1.5 h of 2 cores),
so `persist_partial` also writes the round under way into `<results>/rounds/round-N-partial/`:
its finished stages and the per-task trees its collect saved so far, with `partial.json` listing
them like `round.json`, and, asked for (`with_checkpoint`), the last checkpoint of a train (or
verifier) under way: the LoRA, its best held-out copy and the optimizer state, about 140 MB, a
lot for git, but a replay train of 2-4 h on a slow machine would otherwise start again on every
fresh one and might never finish within one machine's life. `restore_partial` puts them into a
fresh store (a checkpoint only where that store has none of its own and the stage is not
finished there), and once
prepare there rebuilt the round's tasks alike (split files' sha256), `adopt_prepare_report`
puts back the recorded prepare report and manifest too: the collect's saved progress is
fingerprinted with that manifest, whose report carries prepare's timings. The finished round
replaces the partial folder.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROUNDS_DIR = "rounds"
ROUND_FILE = "round.json"
PARTIAL_FILE = "partial.json"
PARTIAL_SUFFIX = "-partial"
# a stopped train's (verifier's) checkpoints, and the stage output that makes them spent
CHECKPOINT_OUTPUTS = {"train-progress/": "adapter/", "verifier-progress/": "verifier/"}
CHECKPOINT_PREFIXES = tuple(CHECKPOINT_OUTPUTS)
SMALL_FILE_BYTES = 16 * 1024  # kept as they are: readable in a diff, little to gain
TASK_FILES = ("train.jsonl", "validation.jsonl", "test.jsonl")  # what prepare must rebuild alike
HELD_OUT_FILES = ("validation.jsonl", "test.jsonl")


def effective_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Every config key the curve's settings give (the defaults they leave included), dotted,
    without the store's location: what a committed round must have been made with."""
    from codeq.config import load_config

    dumped = load_config(None, settings).model_dump(mode="json")
    return {
        f"{section}.{key}": value
        for section, values in dumped.items()
        if section != "store" and isinstance(values, dict)
        for key, value in values.items()
    }


def settings_changes(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Keys whose value differs between a round's settings and this command's; a key added to
    the config since, at the value that reproduces earlier runs, is no change."""
    from codeq.config import is_neutral

    changed = []
    for key in sorted(set(recorded) | set(now)):
        if key not in recorded and is_neutral(key, now[key]):
            continue
        if recorded.get(key, "(absent)") != now.get(key, "(absent)"):
            changed.append(f"{key} {recorded.get(key, '(absent)')} -> {now.get(key, '(absent)')}")
    return changed


def round_prefixes(runs: list[str], number: int) -> list[str]:
    """The store prefixes a round of these runs wrote (the last run is the one the curve goes
    on with), and that run's current policy after the round."""
    return [f"runs/{run}/round-{number}" for run in runs] + [f"runs/{runs[-1]}/current"]


def kept(key: str) -> bool:
    """Whether a round's key goes into git: not the tasks (the data set), nor the per-task
    objects a collect shard saves while it runs (its trajectories.jsonl holds them all)."""
    inside = stage_relative(key)
    if inside.startswith(CHECKPOINT_PREFIXES):  # spent once the round finished
        return False
    return not inside.startswith("tasks/") and "/tasks/" not in inside


def stage_relative(key: str) -> str:
    """A round's key without `runs/<run>/round-N/`."""
    return key.split("/", 3)[3] if key.count("/") >= 3 else key


def kept_partial(key: str) -> bool:
    """Whether an unfinished round's key goes into git: its stages' outputs and the per-task
    trees a collect saved so far; of the tasks only prepare's manifest and report (not the data
    set); of the training checkpoints only the last (`latest_checkpoint_keys`)."""
    inside = stage_relative(key)
    if inside.startswith("tasks/"):
        return inside in PREPARE_RECORD
    return not inside.startswith(CHECKPOINT_PREFIXES)


def checkpoint_prefix(key: str) -> str | None:
    """The round's checkpoint prefix (with the round's key before it) a key lies under."""
    inside = stage_relative(key)
    for prefix in CHECKPOINT_PREFIXES:
        if inside.startswith(prefix):
            return key[: len(key) - len(inside)] + prefix
    return None


def latest_checkpoint_keys(store: Any, keys: list[str]) -> list[str]:
    """Of a round's keys, each checkpoint prefix's LATEST record and every key of the one
    checkpoint it names: what a fresh machine resumes a stopped train (or verifier) from. The
    older ones are deleted as a newer one is complete, so read the store while the stage is
    stopped."""
    from codeq.train.checkpoints import LATEST_NAME

    chosen = []
    for key in keys:
        prefix = checkpoint_prefix(key)
        if prefix is None or key != prefix + LATEST_NAME:
            continue
        named = f"{prefix}checkpoint-{store.get_json(key)['step']}/"
        chosen += [key, *[other for other in keys if other.startswith(named)]]
    return chosen


def spent_checkpoints(store: Any, keys: list[str]) -> set[str]:
    """The checkpoint prefixes of committed `keys` that must stay out of this store: it holds a
    checkpoint of its own there (the machine that wrote the copy went on, or this one did), or
    the stage it would resume finished here. Each prefix is looked up once."""
    from codeq.store import MARKER_NAME

    spent = set()
    for prefix in {checkpoint_prefix(key) for key in keys} - {None}:
        assert prefix is not None
        inside = stage_relative(prefix)
        output = prefix.removesuffix(inside) + CHECKPOINT_OUTPUTS[inside]
        if store.list(prefix) or store.exists(output + MARKER_NAME):
            spent.add(prefix)
    return spent


PREPARE_RECORD = ("tasks/MANIFEST.json", "tasks/report.json")  # no split file: those are data


def ignored_by_git(paths: list[Path]) -> list[Path]:
    """Those of `paths` (written or about to be) that the repository's .gitignore leaves out,
    so a commit would silently lack them (`*.safetensors` did to the kept verifier). Empty
    outside a git checkout."""
    import subprocess

    if not paths:
        return []
    given_paths, paths = (
        paths,
        [path.absolute() for path in paths],
    )  # git -C reads relative paths from its folder
    folder = paths[0].parent
    while not folder.exists():
        folder = folder.parent
    answer = subprocess.run(
        ["git", "-C", str(folder), "check-ignore", "--", *map(str, paths)],
        capture_output=True,
        text=True,
    )
    if answer.returncode not in (0, 1):  # 128: not a checkout, or git missing
        return []
    ignored = set(answer.stdout.splitlines())
    return [given for given, path in zip(given_paths, paths, strict=True) if str(path) in ignored]


def pack(data: bytes) -> bytes:
    """`data` compressed with xz where that saves a tenth or more (JSON Lines, tokenizer.json,
    reports); `data` itself otherwise (an adapter's float32 weights save about 9%)."""
    if len(data) < SMALL_FILE_BYTES:
        return data
    packed = lzma.compress(data, preset=9)
    return packed if len(packed) <= 0.9 * len(data) else data


def read_packed(path: Path) -> bytes:
    """The content of a file a committed round holds under its own name: `path` itself, or
    `path` + '.xz' where `pack` compressed it (a validation results.json with sampled answers
    is large enough to be)."""
    if path.is_file():
        return path.read_bytes()
    return lzma.decompress(path.with_name(path.name + ".xz").read_bytes())


def write_objects(store: Any, folder: Path, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Each key's content under `folder/store/<key>` (xz where it pays), equal contents stored
    once; returns each key's sha256, size and file, as round.json lists them."""
    written: dict[str, str] = {}  # sha256 -> file already holding that content
    listed: dict[str, dict[str, Any]] = {}
    for key in keys:
        data = store.get_bytes(key)
        digest = hashlib.sha256(data).hexdigest()
        name = written.get(digest)
        if name is None:
            packed = pack(data)
            name = f"store/{key}" + (".xz" if packed is not data else "")
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(packed)
            written[digest] = name
        listed[key] = {"sha256": digest, "bytes": len(data), "file": name}
    return listed


def round_folder(results: Path, number: int) -> Path:
    return results / ROUNDS_DIR / f"round-{number}"


def finished_record(results: Path, number: int) -> Path:
    """round.json of finished round `number` (it may not exist)."""
    return round_folder(results, number) / ROUND_FILE


def committed_record(results: Path, number: int) -> Path | None:
    """round.json of round `number` when it finished, else its partial copy's record, if any."""
    for path in (finished_record(results, number), partial_folder(results, number) / PARTIAL_FILE):
        if path.is_file():
            return path
    return None


def partial_folder(results: Path, number: int) -> Path:
    return results / ROUNDS_DIR / f"round-{number}{PARTIAL_SUFFIX}"


def write_record(
    store: Any,
    path: Path,
    number: int,
    runs: list[str],
    settings: dict[str, Any],
    tasks_sha256: dict[str, str],
    keys: list[str],
) -> dict[str, Any]:
    """The objects `keys` beside `path` (see `write_objects`) and the record listing them, which
    a fresh store is restored from; returns the record."""
    entry = {
        "round": number,
        "runs": runs,
        "settings": effective_settings(settings),
        "tasks_sha256": tasks_sha256,
        "keys": write_objects(store, path.parent, keys),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return entry


def persist_round(
    store: Any,
    results: Path,
    number: int,
    runs: list[str],
    settings: dict[str, Any],
    tasks_manifest_key: str,
) -> Path:
    """Copy round `number` of `runs` from the store into `<results>/rounds/round-N/` (the
    round's partial folder, now spent, is removed)."""
    keys = [key for prefix in round_prefixes(runs, number) for key in store.list(prefix)]
    tasks_sha256 = task_files_sha256(store, tasks_manifest_key)
    path = finished_record(results, number)
    write_record(store, path, number, runs, settings, tasks_sha256, [k for k in keys if kept(k)])
    shutil.rmtree(partial_folder(results, number), ignore_errors=True)
    return path.parent


def persist_partial(
    store: Any,
    results: Path,
    number: int,
    runs: list[str],
    settings: dict[str, Any],
    tasks_manifest_key: str,
    with_checkpoint: bool = False,
) -> dict[str, Any]:
    """What the store holds so far of unfinished round `number` into
    `<results>/rounds/round-N-partial/`, replacing an earlier partial copy; returns its
    record. `with_checkpoint`: also a stopped train's (or verifier's) last checkpoint, about
    140 MB once trained, so asked for only where it saves hours."""
    from codeq.errors import BadInputError

    if finished_record(results, number).is_file():
        raise BadInputError(
            f"round {number} is finished and committed already "
            f"({finished_record(results, number)})",
            hint="a partial copy is for the round under way",
        )
    folder = partial_folder(results, number)
    shutil.rmtree(folder, ignore_errors=True)
    keys = [key for prefix in round_prefixes(runs, number)[:-1] for key in store.list(prefix)]
    tasks_sha256 = (
        task_files_sha256(store, tasks_manifest_key) if store.exists(tasks_manifest_key) else {}
    )
    kept_keys = [key for key in keys if kept_partial(key)]
    if with_checkpoint:
        kept_keys += latest_checkpoint_keys(store, keys)
    return write_record(
        store, folder / PARTIAL_FILE, number, runs, settings, tasks_sha256, kept_keys
    )


def committed_rounds(results: Path) -> list[int]:
    """The round numbers `<results>/rounds/` holds, in order."""
    found = []
    for path in sorted((results / ROUNDS_DIR).glob(f"round-*/{ROUND_FILE}")):
        suffix = path.parent.name.removeprefix("round-")
        if suffix.isdigit():
            found.append(int(suffix))
    return sorted(found)


def read_committed(
    results: Path, number: int, settings: dict[str, Any], path: Path | None = None
) -> dict[str, Any]:
    """A committed round's record (`path`: its partial.json instead), refused when it was made
    with other curve settings."""
    from codeq.errors import CorruptInputError

    path = path or finished_record(results, number)
    entry: dict[str, Any] = json.loads(path.read_text())
    changed = settings_changes(entry.get("settings") or {}, effective_settings(settings))
    if changed:
        raise CorruptInputError(
            f"{path} was made with other curve settings than this command's: "
            + "; ".join(changed[:3])
            + (f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""),
            hint="run the curve with the options its section of docs/results.md names, or "
            "give a new --results folder for another curve",
        )
    return entry


# the hint of every refused committed file, a curve round's or a kept verifier's
RESTORE = (
    "restore the file from git (git checkout -- it); nothing committed is recomputed or overwritten"
)


def committed_content(
    folder: Path, key: str, recorded: dict[str, Any], record: Path | None = None
) -> bytes:
    """A committed object's content, checked against its sha256 (one line naming the file and
    the record that lists it: `record`, by default the round's round.json in `folder`)."""
    from codeq.schemas import read_kept

    record = record or folder / ROUND_FILE
    return read_kept(folder / recorded["file"], recorded["sha256"], record, RESTORE, key)


def restore_round(store: Any, results: Path, number: int, settings: dict[str, Any]) -> bool:
    """Put committed round `number` into the store; True when it was put there, False when the
    store already held it (then it must hold the same content)."""
    entry = read_committed(results, number, settings)
    folder = round_folder(results, number)
    contents = {
        key: committed_content(folder, key, recorded) for key, recorded in entry["keys"].items()
    }
    held = [key for key in contents if key.endswith("/_COMPLETE") and store.exists(key)]
    if held:
        check_store_holds(store, folder, entry, number)
        return False
    put_objects(store, contents)
    return True


def running_state(key: str) -> bool:
    """An evaluation's resume state (`eval-progress/<role>/<split>/<label>/STATE.json`): it is
    rewritten with each tree saved (its seconds so far), so a store that went on after a
    partial copy was made holds a later one. The trees themselves never change once saved,
    and PROGRESS.json's fingerprint refuses saved trees of another configuration."""
    inside = stage_relative(key)
    return inside.startswith("eval-progress/") and inside.endswith("/STATE.json")


def progress_record(key: str) -> bool:
    """An evaluation's PROGRESS.json: the fingerprint its saved trees were searched under."""
    inside = stage_relative(key)
    return inside.startswith("eval-progress/") and inside.endswith("/PROGRESS.json")


def same_but_tasks(ours: bytes, committed: bytes) -> bool:
    """Two PROGRESS.json records whose fingerprints differ at most in the tasks checksum."""
    fingerprints = [json.loads(data).get("fingerprint") or {} for data in (ours, committed)]
    config = [fingerprint.get("config") for fingerprint in fingerprints]
    inputs = [dict(fingerprint.get("inputs") or {}) for fingerprint in fingerprints]
    for named in inputs:
        named.pop("tasks", None)
    return config[0] == config[1] and inputs[0] == inputs[1]


def check_store_holds(store: Any, folder: Path, entry: dict[str, Any], number: int) -> None:
    """Every committed key the store holds must hold the committed content (markers, which carry
    times, the run's current policy, which moves on, and an evaluation's running state, see
    `running_state`, aside)."""
    from codeq.errors import CorruptInputError

    for key, recorded in entry["keys"].items():
        if key.endswith("/_COMPLETE") or "/current/" in key or not store.exists(key):
            continue
        if running_state(key):  # a later stop's store is ahead of the copy: its own stands
            continue
        if progress_record(key) and same_but_tasks(
            store.get_bytes(key), committed_content(folder, key, recorded)
        ):  # carried to this machine's tasks (`carry_eval_progress`), then rewritten by the run
            continue
        if hashlib.sha256(store.get_bytes(key)).hexdigest() != recorded["sha256"]:
            raise CorruptInputError(
                f"the store's {key} differs from {folder / recorded['file']} (committed "
                f"round {number})",
                hint="this store computed the round again and drew another one; continue "
                "in a new --out, or delete the store to continue from git",
            )


def put_objects(store: Any, contents: dict[str, bytes]) -> None:
    markers = [key for key in contents if key.endswith("/_COMPLETE")]
    for key in [key for key in contents if key not in markers] + markers:  # markers last
        store.put_bytes(key, contents[key])


def partial_rounds(results: Path) -> list[int]:
    """The unfinished rounds `<results>/rounds/` holds a partial copy of (none finished)."""
    found = []
    for path in (results / ROUNDS_DIR).glob(f"round-*{PARTIAL_SUFFIX}/{PARTIAL_FILE}"):
        number = path.parent.name.removeprefix("round-").removesuffix(PARTIAL_SUFFIX)
        if number.isdigit() and not finished_record(results, int(number)).is_file():
            found.append(int(number))
    return sorted(found)


def restore_partial(store: Any, results: Path, number: int, settings: dict[str, Any]) -> int:
    """Put the committed part of unfinished round `number` into the store, except prepare's
    record (see `adopt_prepare_report`); the keys the store holds already must hold the same
    content. Returns how many objects it put."""
    folder = partial_folder(results, number)
    entry = read_committed(results, number, settings, folder / PARTIAL_FILE)
    spent = spent_checkpoints(store, list(entry["keys"]))
    entry["keys"] = {
        key: recorded
        for key, recorded in entry["keys"].items()
        if stage_relative(key) not in PREPARE_RECORD  # this machine's differ in timings
        and checkpoint_prefix(key) not in spent
    }
    return put_missing(store, folder, entry, number)


def put_missing(
    store: Any, folder: Path, entry: dict[str, Any], number: int, record: Path | None = None
) -> int:
    """Put the committed objects of `entry` (kept in `folder`, listed in `record`) that the
    store lacks; those it holds must hold the same content (`check_store_holds`). Returns how
    many it put."""
    check_store_holds(store, folder, entry, number)
    missing = {
        key: committed_content(folder, key, recorded, record)
        for key, recorded in entry["keys"].items()
        if not store.exists(key)
    }
    put_objects(store, missing)
    return len(missing)


def adopt_prepare_report(store: Any, results: Path, number: int, tasks_manifest_key: str) -> bool:
    """After prepare rebuilt an unfinished round's tasks alike (checked by `check_tasks`), its
    recorded report and manifest replace this machine's, which differ in prepare's timings
    only: the collect progress restored with them is fingerprinted with that manifest.
    True when they were put."""
    folder = partial_folder(results, number)
    if not (folder / PARTIAL_FILE).is_file() or finished_record(results, number).is_file():
        return False
    entry = json.loads((folder / PARTIAL_FILE).read_text())
    record = {
        key: committed_content(folder, key, recorded)
        for key, recorded in entry["keys"].items()
        if stage_relative(key) in PREPARE_RECORD
        and key.rsplit("/", 2)[0] == tasks_manifest_key.rsplit("/", 2)[0]
    }
    for key, data in sorted(record.items(), key=lambda item: item[0].endswith("MANIFEST.json")):
        store.put_bytes(key, data)  # the manifest last: it vouches for the report
    return bool(record)


HELD_OUT_READ_BY_EVALUATE = ("validation.jsonl", "test.jsonl")


def carry_eval_progress(
    store: Any, results: Path, number: int, tasks_manifest_key: str
) -> str | None:
    """An unfinished round's saved evaluation trees were fingerprinted with the tasks manifest
    of the machine that searched them. Where this machine's prepare built other train tasks
    (the same tasks, `same_searched_tasks`) but the same validation and test files, which are
    all an evaluation reads, those trees stand: each progress record's tasks checksum becomes
    this machine's manifest's. A held-out file that differs because this machine built round
    0's where the round's record was not (`held_out_as_round_0s`) takes the trees saved on it
    with it: they are deleted, searched again on round 0's, and the other split's trees stand.
    Any other difference (config, adapter, other held-out files) is left for the evaluate
    stage to refuse. A note when a record was carried, else None."""
    import hashlib

    from codeq.pipeline.fingerprint import Fingerprint

    folder = partial_folder(results, number)
    if not (folder / PARTIAL_FILE).is_file() or finished_record(results, number).is_file():
        return None
    entry = json.loads((folder / PARTIAL_FILE).read_text())
    if tasks_manifest_key not in entry["keys"]:
        return None
    recorded = committed_content(folder, tasks_manifest_key, entry["keys"][tasks_manifest_key])
    round_prefix = tasks_manifest_key.rsplit("/", 2)[0]
    built = store.get_bytes(tasks_manifest_key)
    was, now = hashlib.sha256(recorded).hexdigest(), hashlib.sha256(built).hexdigest()
    recorded_files = json.loads(recorded)["files"]
    built_files = json.loads(built)["files"]
    moved = [
        name
        for name in HELD_OUT_READ_BY_EVALUATE
        if recorded_files.get(name) != built_files.get(name)
    ]
    if was == now or not all(
        is_round_0s(results, name, (built_files.get(name) or {}).get("sha256", ""))
        for name in moved
    ):
        return None
    dropped = [
        key
        for key in store.list(f"{round_prefix}/eval-progress")
        for name in moved
        if f"/{name.removesuffix('.jsonl')}/" in key.removeprefix(f"{round_prefix}/eval-progress")
    ]
    for key in dropped:
        store.delete(key)
    carried = []
    for key in store.list(f"{round_prefix}/eval-progress"):
        if not key.endswith("/PROGRESS.json"):
            continue
        record = json.loads(store.get_bytes(key))
        fingerprint = record.get("fingerprint") or {}
        inputs = dict(fingerprint.get("inputs") or {})
        if inputs.get("tasks") != was:
            continue
        inputs["tasks"] = now
        record["fingerprint"] = Fingerprint(config=fingerprint["config"], inputs=inputs).to_json()
        store.put_json(key, record)
        carried.append(key.removeprefix(f"{round_prefix}/"))
    if not carried:
        return None
    other = [n for n in TASK_FILES if recorded_files.get(n) != built_files.get(n)]
    searched_again = ""
    if moved:
        searched_again = (
            f"; the {len(dropped)} objects it saved on {' and '.join(moved)} are deleted, to "
            "be searched again on round 0's"
            if dropped
            else f"; it had saved nothing on {' and '.join(moved)}"
        )
    return (
        f"round {number}: its saved evaluation trees ({', '.join(carried)}) stand with the "
        f"tasks built here (other {' and '.join(other) or 'report'} than its record)"
        f"{searched_again}"
    )


def task_files_sha256(store: Any, tasks_manifest_key: str) -> dict[str, str]:
    """The sha256 of each split file prepare wrote, read from its manifest."""
    files = json.loads(store.get_bytes(tasks_manifest_key))["files"]
    return {name: files[name]["sha256"] for name in TASK_FILES if name in files}


def check_tasks(store: Any, results: Path, number: int, tasks_manifest_key: str) -> str | None:
    """The tasks this machine's prepare built for a committed round (finished, or the partial
    copy of one under way) must be the recorded ones. Two exceptions, returned as a note, both
    for what a loaded machine's prepare does: it keeps a generated hidden test only when the
    oracle answers it within its limit, so it may drop a few tests, or a task whose bug no test
    left catches.
    - Once a round's collect finished, its train tasks (the ones it searched) may differ in
      content but not in which tasks they are: the round's trees, pairs and adapter stand as
      committed, and later rounds read only the validation and test files.
    - A round whose recorded validation or test file was not round 0's (its prepare dropped a
      test, or a task, which reorders the split) is rebuilt here with round 0's, the ones every
      new round must have (`prepare_held_out_alike`). A finished round's committed evaluation
      stands as made on its own tasks, and nothing later reads that round's held-out files; a
      round under way evaluates on round 0's, its trees saved on the other file searched again
      (`carry_eval_progress`)."""
    from codeq.errors import CorruptInputError

    path = committed_record(results, number)
    if path is None:
        return None
    finished = path == finished_record(results, number)
    entry = json.loads(path.read_text())
    recorded: dict[str, str] = entry["tasks_sha256"]
    if not recorded:  # a partial copy made before prepare finished
        return None
    now = task_files_sha256(store, tasks_manifest_key)
    differing = sorted(
        name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name)
    )
    notes = []
    if "train.jsonl" in differing:  # a partial copy's collect may have finished too
        note = same_searched_tasks(store, path, entry, number, tasks_manifest_key)
        if note:
            differing.remove("train.jsonl")
            notes.append(note)
    if number > 0:
        for name in [name for name in differing if name in HELD_OUT_FILES]:
            note = held_out_as_round_0s(results, number, name, now[name], recorded[name], finished)
            if note:
                differing.remove(name)
                notes.append(note)
    if differing:
        raise CorruptInputError(
            f"round {number}'s tasks built here differ from those {path} was made with: "
            + "; ".join(
                f"{name} (sha256 {now.get(name, 'absent')[:12]} here, "
                f"{recorded.get(name, 'absent')[:12]} recorded)"
                for name in differing
            ),
            hint="a busy machine's prepare times the oracle slower (other per-call limits, "
            "dropped tests): run it again with nothing else on the CPUs; else use the "
            "DebugBench copy the curve used (--source), or a new --results folder"
            + ("" if finished else f"; or delete {path.parent} to compute round {number} again"),
        )
    return "; ".join(notes) or None


def check_tasks_preparing_again(
    store: Any,
    results: Path,
    number: int,
    tasks_manifest_key: str,
    prepare_again: Callable[[], None],
    say: Callable[[str], None],
) -> str | None:
    """`check_tasks`, with the round prepared again, up to PREPARE_ATTEMPTS times in all, where
    this machine built other tasks than its record in git: a loaded machine's prepare drops a
    hidden test the oracle did not answer in time, or sets a coarser per-call limit, and the
    next prepare usually builds the recorded files (a CI run on a busy machine: round 1's
    validation file rebuilt for a fresh store differed from its partial copy's). Each attempt
    is said; the last refusal is raised."""
    from codeq.errors import CorruptInputError

    for attempt in range(1, PREPARE_ATTEMPTS + 1):
        try:
            return check_tasks(store, results, number, tasks_manifest_key)
        except CorruptInputError as refused:
            if attempt == PREPARE_ATTEMPTS:
                raise
            say(f"{refused}; preparing again (attempt {attempt + 1} of {PREPARE_ATTEMPTS})")
            prepare_again()
    raise AssertionError("unreachable: the last attempt returns or raises")


def same_searched_tasks(
    store: Any, path: Path, entry: dict[str, Any], number: int, tasks_manifest_key: str
) -> str | None:
    """A note when the train file built here holds exactly the tasks the committed round's
    collect searched, else None."""
    train = tasks_manifest_key.rsplit("/", 1)[0] + "/train.jsonl"
    searched = searched_task_ids(path.parent, entry)
    if not searched or searched != built_task_ids(store, train):
        return None
    now = task_files_sha256(store, tasks_manifest_key)["train.jsonl"]
    return (
        f"round {number}'s train tasks built here differ in content from those "
        f"{path} was made with (sha256 {now[:12]} here, "
        f"{entry['tasks_sha256']['train.jsonl'][:12]} recorded) but are the same "
        f"{len(searched)} tasks: its trees stand as committed"
    )


def held_out_as_round_0s(
    results: Path, number: int, name: str, built: str, recorded: str, finished: bool
) -> str | None:
    """A note when held-out file `name` built here for round `number` (finished, or under way)
    is round 0's and the round's recorded one was not, else None."""
    if not is_round_0s(results, name, built) or is_round_0s(results, name, recorded):
        return None
    what = f"round {number}" if finished else f"round {number}'s partial copy"
    then = (
        "its committed evaluation stands as made on its own tasks"
        if finished
        else "its evaluation goes on with them, and the trees it saved on the other file are "
        "searched again"
    )
    return (
        f"{what} was made on other {name} tasks than round 0's (sha256 "
        f"{recorded[:12]} recorded, round 0's {built[:12]}); this machine built round 0's, "
        f"as every new round must: {then}"
    )


def is_round_0s(results: Path, name: str, sha256: str) -> bool:
    """Whether `sha256` is that of the curve's round 0's split file `name` (its record in git)."""
    first = committed_record(results, 0)
    return first is not None and json.loads(first.read_text())["tasks_sha256"].get(name) == sha256


def searched_task_ids(folder: Path, entry: dict[str, Any]) -> set[str]:
    """The tasks a committed round's collect searched, from its trajectories."""
    ids: set[str] = set()
    for key, recorded in entry["keys"].items():
        if key.endswith("/trajectories.jsonl") and "/trajectories/" in key:
            lines = committed_content(folder, key, recorded).decode().splitlines()
            ids.update(json.loads(line)["task_id"] for line in lines if line.strip())
    return ids


def built_task_ids(store: Any, key: str) -> set[str]:
    return set(built_task_order(store, key))


def built_task_order(store: Any, key: str) -> list[str]:
    """The task ids of a split file prepare wrote, in its order."""
    lines = store.get_bytes(key).decode().splitlines()
    return [json.loads(line).get("task_id") for line in lines if line.strip()]


PREPARE_ATTEMPTS = 3  # a round's prepare in all, where it built other held-out tasks


def held_out_differences(store: Any, first_tasks: str, tasks: str) -> list[str]:
    """The held-out files whose tasks, in order, differ from the curve's first round's (the
    store folders of their prepare). Prepare keeps a hidden test only when the oracle answers it
    in time, so a loaded machine can drop one and with it a task whose bug only that test caught;
    the split's seeded shuffle then orders the rest anew (round 8 of the third curve: one task
    fewer, 21 of the first 60 test tasks other ones). The tests' content may differ (the
    per-call limit moves with the load); every round's candidate and incumbent meet the same."""
    return [
        name
        for name in HELD_OUT_FILES
        if built_task_order(store, f"{first_tasks}/{name}")
        != built_task_order(store, f"{tasks}/{name}")
    ]


def prepare_held_out_alike(
    store: Any,
    results: Path,
    number: int,
    tasks: tuple[str, str],
    prepare_again: Callable[[], None],
) -> Iterator[str]:
    """Round `number`'s validation and test tasks are made the curve's first round's (`tasks`:
    the store folders of round 0's prepare and of this round's): prepared again, up to
    PREPARE_ATTEMPTS times in all, where a loaded machine built others (a note each time), then
    refused with one line naming the files. A round in git is held to its own record instead
    (`check_tasks`)."""
    from codeq.errors import CorruptInputError

    first_tasks, round_tasks = tasks
    if number == 0 or committed_record(results, number):
        return
    for attempt in range(1, PREPARE_ATTEMPTS + 1):
        differing = held_out_differences(store, first_tasks, round_tasks)
        if not differing:
            return
        named = " and ".join(differing)
        if attempt == PREPARE_ATTEMPTS:
            raise CorruptInputError(
                f"round {number}'s prepare built other tasks in {named} than round 0 in "
                f"{PREPARE_ATTEMPTS} attempts",
                hint="prepare keeps a hidden test only when the oracle answers it in time: run "
                "the curve's rounds on a machine that runs nothing else meanwhile",
            )
        yield (
            f"round {number}: prepare built other tasks in {named} than round 0; preparing "
            f"again (attempt {attempt + 1} of {PREPARE_ATTEMPTS})"
        )
        prepare_again()
