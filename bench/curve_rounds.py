"""A learning curve's finished rounds, kept in git: what a fresh machine needs to go on from them
and what anyone needs to check them.

`persist_round` copies a finished round's store objects (trajectories, pairs, adapter, evaluation
with its searched trees, promotion decision, report, and the run's current policy after the
round) into `<results>/rounds/round-N/`: every object under `store/<its key>`, JSON Lines
compressed with xz (`<key>.xz`), an object equal to one already copied stored once, and
`round.json` listing each key with the sha256 and size of its content. The tasks (DebugBench
itself) are left out: the curve's prepare stage builds them again, and `round.json` records the
sha256 of their manifest, so tasks that came out different are caught.

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
COMPRESSED = (".jsonl",)  # what xz shrinks tenfold; the rest is small or binary (safetensors)


def settings_digest(settings: dict[str, Any]) -> str:
    """The curve's settings (without the store's location), as the round records them."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def round_prefixes(runs: list[str], number: int) -> list[str]:
    """The store prefixes a round of these runs wrote (the last run is the one the curve goes
    on with), and that run's current policy after the round."""
    return [f"runs/{run}/round-{number}" for run in runs] + [f"runs/{runs[-1]}/current"]


def kept(key: str) -> bool:
    """Whether a round's key goes into git: not the tasks (the data set), nor the per-task
    objects a collect shard saves while it runs (its trajectories.jsonl holds them all)."""
    inside = key.split("/", 3)[3] if key.count("/") >= 3 else key
    return not inside.startswith("tasks/") and "/tasks/" not in inside


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
                name = f"store/{key}" + (".xz" if key.endswith(COMPRESSED) else "")
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                packed = lzma.compress(data, preset=9) if name.endswith(".xz") else data
                target.write_bytes(packed)
                written[digest] = name
            keys[key] = {"sha256": digest, "bytes": len(data), "file": name}
    entry = {
        "round": number,
        "runs": runs,
        "settings_sha256": settings_digest(settings),
        "tasks_manifest_sha256": hashlib.sha256(store.get_bytes(tasks_manifest_key)).hexdigest(),
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
    if entry.get("settings_sha256") != settings_digest(settings):
        raise CorruptInputError(
            f"{path} was made with other curve settings than this command's "
            f"(settings sha256 {str(entry.get('settings_sha256'))[:12]}, now "
            f"{settings_digest(settings)[:12]})",
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


def check_tasks(store: Any, results: Path, number: int, tasks_manifest_key: str) -> None:
    """The tasks this machine's prepare built for a committed round must be the recorded ones."""
    from codeq.errors import CorruptInputError

    path = results / ROUNDS_DIR / f"round-{number}" / ROUND_FILE
    if not path.is_file():
        return
    recorded = json.loads(path.read_text())["tasks_manifest_sha256"]
    now = hashlib.sha256(store.get_bytes(tasks_manifest_key)).hexdigest()
    if now != recorded:
        raise CorruptInputError(
            f"round {number}'s tasks built here differ from those {path} was made with "
            f"(manifest sha256 {now[:12]}, recorded {recorded[:12]})",
            hint="use the DebugBench copy the curve used (--source), or a new --results folder",
        )
