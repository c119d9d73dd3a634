"""One-time model download into the chart's model cache (the `model.download` Helm hook Job).

CODEQ_MODEL_REPOS is a JSON list of "org/name" or "org/name@revision"; each repository is
downloaded to MODELS_DIR/org/name (default /models). `snapshot_download` skips files that are
already complete, so a rerun (helm upgrade) only fetches what is missing. A token for gated
models comes from HF_TOKEN_PATH (a mounted Secret file), never from an env var.
"""

from __future__ import annotations

import json
import os
import sys


def targets(specs: list[str], root: str) -> list[tuple[str, str | None, str]]:
    """(repo id, revision or None, target folder) per spec; refuses ids that could escape root."""
    found = []
    for spec in specs:
        repo, _, revision = spec.partition("@")
        parts = repo.split("/")
        if len(parts) != 2 or any(part in ("", ".", "..") for part in parts):
            raise SystemExit(f"error: {spec!r} is not a Hugging Face repository id (org/name)")
        found.append((repo, revision or None, os.path.join(root, *parts)))
    return found


def main() -> int:
    from huggingface_hub import snapshot_download

    root = os.environ.get("MODELS_DIR", "/models")
    for repo, revision, target in targets(json.loads(os.environ["CODEQ_MODEL_REPOS"]), root):
        print(f"downloading {repo}@{revision or 'main'} -> {target}", flush=True)
        snapshot_download(repo_id=repo, revision=revision, local_dir=target)
        print(f"done: {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
