#!/bin/sh
# Entrypoint of both CodeQ images: make the scratch folders the stage expects on its (writable)
# emptyDir mounts, then run the stage command (`python -m jobs.<stage>`) as PID 1's child-free
# replacement so signals (SIGTERM on preemption) reach Python directly.
set -eu
scratch="${CODEQ_SCRATCH_DIR:-/scratch}"
for dir in "$scratch" "${XDG_CACHE_HOME:-$scratch/cache}" "${TMPDIR:-/tmp}"; do
  mkdir -p "$dir" 2>/dev/null || true
done
exec "$@"
