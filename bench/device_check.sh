#!/usr/bin/env bash
# The GPU checks of the policy backends (issue 35) in one prepared run: bench/gpu.py on one CUDA
# GPU, the 7B's architecture with random weights. What it measures, part by part, each written
# to $OUT (gpu.md: the table, gpu.json: every number) as soon as it ends, so a run stopped at a
# device limit keeps every part it finished:
#   (a) bf16: every backend that runs there (engine, transformers; vllm where installed) and
#       `generate`, ABBA, batch 1/16/64 of 400-1500-token prompts (the time to first token is
#       the prompt-reading rate) and 8 prompts x 8 samples
#   (b) one DPO step, LoRA bf16, on 16 pairs of 2048 tokens
#   (a) FP8: vLLM alone (skipped without vllm)   (a) NF4: as bf16, 4-bit weights
#   (b) QLoRA NF4 step   (b) LoRA fp32 step   (c) the projected round, from (a) and (b)
# It starts no part after 420 s and is stopped at 540 s: within 9 minutes of device time.
#
# Any session holding a device runs this first. Two steps:
#   here (network), once:   bench/device_check.sh prepare
#       downloads the Python 3.12 wheels the device image lacks or has too old (transformers
#       5.23, trl, peft, bitsandbytes, datasets and its dill, multiprocess and fsspec,
#       pydantic and pydantic-settings, at constraints.txt's versions; 62 MB) into
#       .device-wheels/, which it makes git-ignored in .git/info/exclude; `prepare --no-nf4`
#       leaves bitsandbytes (43 MB) out, and the NF4 parts with it. huggingface-hub stays the
#       image's (1.33, enough for transformers 5.23): our 2.4 imports httpx2, which the image
#       lacks. A run carries the tracked tree too, and the committed curve rounds
#       (docs/results/*/rounds, 36 MB a round) put it far past the 64 MiB a run carries:
#   here, before the run:   bench/device_check.sh travel-light
#       untracks those rounds in the index only (git rm --cached) and ignores them in
#       .git/info/exclude, so the tree that travels is the 4 MB of code and docs
#   on the device:          run(command="bench/device_check.sh", carry=[".device-wheels"],
#                               timeout_s=600)
#   here, after the run:    bench/device_check.sh travel-restore   (the index as it was)
# The device image has no vLLM and cannot get one (no network; vLLM 0.30's wheel alone is 300 MB,
# with torch 2.13's CUDA wheels over a gigabyte), so there the vllm arms are reported missing;
# they run where `pip install 'codeq[vllm]'` was possible (the CUDA infer image).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=.device-wheels
python=${PYTHON:-python3}

if [[ ${1:-} == prepare ]]; then
  pins=(transformers trl peft datasets dill multiprocess fsspec pydantic
        pydantic-core pydantic-settings annotated-types typing-inspection python-dotenv)
  [[ ${2:-} == --no-nf4 ]] || pins+=(bitsandbytes)
  wanted=()
  for name in "${pins[@]}"; do
    wanted+=("$(grep -i "^${name}==" constraints.txt)")
  done
  platforms=()
  for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014; do
    platforms+=(--platform "${tag}_x86_64")
  done
  mkdir -p "$wheels"
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    "${platforms[@]}" --platform any -d "$wheels" "${wanted[@]}"
  grep -qx "/$wheels/" .git/info/exclude 2>/dev/null || echo "/$wheels/" >>.git/info/exclude
  du -sh "$wheels"
  exit 0
fi

heavy=docs/results/*/rounds
if [[ ${1:-} == travel-light ]]; then
  for folder in $heavy; do
    [[ -d $folder ]] || continue
    git rm -r -q --cached "$folder"
    grep -qx "/$folder/" .git/info/exclude || echo "/$folder/" >>.git/info/exclude
  done
  echo "untracked in the index: $(echo $heavy); run bench/device_check.sh travel-restore after"
  exit 0
fi
if [[ ${1:-} == travel-restore ]]; then
  for folder in $heavy; do
    [[ -d $folder ]] || continue
    git reset -q -- "$folder"
    grep -vx "/$folder/" .git/info/exclude >.git/info/exclude.new || true
    mv .git/info/exclude.new .git/info/exclude
  done
  git status --short -- $heavy
  exit 0
fi

out=${OUT:-/tmp/device-check}
mkdir -p "$out"
export PYTHONPATH=$PWD
python_tag=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if compgen -G "$wheels/*.whl" >/dev/null && [[ $python_tag != 3.12 ]]; then
  echo "note: $wheels holds wheels for the device's Python 3.12; this is $python_tag: not installed"
elif compgen -G "$wheels/*.whl" >/dev/null; then
  site=/tmp/device-site
  "$python" -m pip install -q --no-deps --no-index --no-compile --target "$site" "$wheels"/*.whl
  export PYTHONPATH=$site:$PWD
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  "$python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  "$python" -c 'import vllm; print("vllm", vllm.__version__)' 2>/dev/null || echo "vllm: not installed"
} | tee "$out/machine.txt"
nf4=()
"$python" -c 'import bitsandbytes' 2>/dev/null || nf4=(--no-nf4)
status=0
timeout 540 "$python" bench/gpu.py --new-tokens 64 --repeats 2 --budget-s 420 \
  --json "$out/gpu.json" --markdown "$out/gpu.md" "${nf4[@]}" >"$out/gpu.log" 2>&1 || status=$?
tail -n 60 "$out/gpu.log"
echo "bench/gpu.py exit status $status (124: stopped at 540 s; $out/gpu.md holds the parts done)"
exit "$status"
