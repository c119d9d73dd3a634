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
"""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path
from typing import Any

ROUNDS_DIR = "rounds"
ROUND_FILE = "round.json"
SMALL_FILE_BYTES = 16 * 1024  # kept as they are: readable in a diff, little to gain
TASK_FILES = ("train.jsonl", "validation.jsonl", "test.jsonl")  # what prepare must rebuild alike


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
    inside = key.split("/", 3)[3] if key.count("/") >= 3 else key
    return not inside.startswith("tasks/") and "/tasks/" not in inside


def pack(data: bytes) -> bytes:
    """`data` compressed with xz where that saves a tenth or more (JSON Lines, tokenizer.json,
    reports); `data` itself otherwise (an adapter's float32 weights save about 9%)."""
    if len(data) < SMALL_FILE_BYTES:
        return data
    packed = lzma.compress(data, preset=9)
    return packed if len(packed) <= 0.9 * len(data) else data


def persist_round(
    store: Any,
    results: Path,
    number: int,
    runs: list[str],
    settings: dict[str, Any],
    tasks_manifest_key: str,
) -> Path:
    """Copy round `number` of `runs` from the store into `<results>/rounds/round-N/`."""
    folder = results / ROUNDS_DIR / f"round-{number}"
    written: dict[str, str] = {}  # sha256 -> file already holding that content
    keys: dict[str, dict[str, Any]] = {}
    for prefix in round_prefixes(runs, number):
        for key in store.list(prefix):
            if not kept(key):
                continue
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
            keys[key] = {"sha256": digest, "bytes": len(data), "file": name}
    entry = {
        "round": number,
        "runs": runs,
        "settings": effective_settings(settings),
        "tasks_sha256": task_files_sha256(store, tasks_manifest_key),
        "keys": keys,
    }
    (folder / ROUND_FILE).write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    return folder


def committed_rounds(results: Path) -> list[int]:
    """The round numbers `<results>/rounds/` holds, in order."""
    found = []
    for path in sorted((results / ROUNDS_DIR).glob(f"round-*/{ROUND_FILE}")):
        suffix = path.parent.name.removeprefix("round-")
        if suffix.isdigit():
            found.append(int(suffix))
    return sorted(found)


def read_committed(results: Path, number: int, settings: dict[str, Any]) -> dict[str, Any]:
    """A committed round's record, refused when it was made with other curve settings."""
    from codeq.errors import CorruptInputError

    path = results / ROUNDS_DIR / f"round-{number}" / ROUND_FILE
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


def committed_content(folder: Path, key: str, recorded: dict[str, Any]) -> bytes:
    """A committed object's content, checked against its sha256 (one line naming the file)."""
    from codeq.errors import CorruptInputError

    path = folder / recorded["file"]
    if not path.is_file():
        raise CorruptInputError(f"{path} is missing (listed for {key} in {folder / ROUND_FILE})")
    data = path.read_bytes()
    if path.name.endswith(".xz"):
        try:
            data = lzma.decompress(data)
        except lzma.LZMAError as exc:
            raise CorruptInputError(f"{path} is not a readable xz file ({exc})") from exc
    if hashlib.sha256(data).hexdigest() != recorded["sha256"]:
        raise CorruptInputError(
            f"{path} fails its sha256 (recorded in {folder / ROUND_FILE} for {key})",
            hint="restore the file from git (git checkout -- it); a round is never recomputed "
            "over committed files",
        )
    return data


def restore_round(store: Any, results: Path, number: int, settings: dict[str, Any]) -> bool:
    """Put committed round `number` into the store; True when it was put there, False when the
    store already held it (then it must hold the same content)."""
    from codeq.errors import CorruptInputError

    entry = read_committed(results, number, settings)
    folder = results / ROUNDS_DIR / f"round-{number}"
    contents = {
        key: committed_content(folder, key, recorded) for key, recorded in entry["keys"].items()
    }
    held = [key for key in contents if key.endswith("/_COMPLETE") and store.exists(key)]
    if held:
        for key, recorded in entry["keys"].items():
            if key.endswith("/_COMPLETE") or "/current/" in key:
                continue  # markers carry times; current moves on with later rounds
            present = store.exists(key) and hashlib.sha256(store.get_bytes(key)).hexdigest()
            if present != recorded["sha256"]:
                raise CorruptInputError(
                    f"the store's {key} differs from {folder / recorded['file']} (committed "
                    f"round {number})",
                    hint="this store computed the round again and drew another one; continue "
                    "in a new --out, or delete the store to continue from git",
                )
        return False
    markers = [key for key in contents if key.endswith("/_COMPLETE")]
    for key in [key for key in contents if key not in markers] + markers:  # markers last
        store.put_bytes(key, contents[key])
    return True


def task_files_sha256(store: Any, tasks_manifest_key: str) -> dict[str, str]:
    """The sha256 of each split file prepare wrote, read from its manifest."""
    files = json.loads(store.get_bytes(tasks_manifest_key))["files"]
    return {name: files[name]["sha256"] for name in TASK_FILES if name in files}


def check_tasks(store: Any, results: Path, number: int, tasks_manifest_key: str) -> None:
    """The tasks this machine's prepare built for a committed round must be the recorded ones."""
    from codeq.errors import CorruptInputError

    path = results / ROUNDS_DIR / f"round-{number}" / ROUND_FILE
    if not path.is_file():
        return
    recorded: dict[str, str] = json.loads(path.read_text())["tasks_sha256"]
    now = task_files_sha256(store, tasks_manifest_key)
    differing = sorted(
        name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name)
    )
    if differing:
        raise CorruptInputError(
            f"round {number}'s tasks built here differ from those {path} was made with: "
            + "; ".join(
                f"{name} (sha256 {now.get(name, 'absent')[:12]} here, "
                f"{recorded.get(name, 'absent')[:12]} recorded)"
                for name in differing
            ),
            hint="use the DebugBench copy the curve used (--source), or a new --results folder",
        )
