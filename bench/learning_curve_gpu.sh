#!/usr/bin/env bash
# The learning curve's test evaluation on one CUDA GPU: the same tasks, seed and settings as the
# CPU figures in docs/results.md (bench/learning_curve.py --write-eval-config), bf16 weights
# (no 4-bit: the CPU figures are bf16 too). One `codeq evaluate` per mode, so that a run cut
# short keeps the modes it finished; each mode's results.json is copied to OUT/LABEL-MODE.json
# and its wall time appended to OUT/times.txt.
#
#   bench/learning_curve_gpu.sh MODEL TASKS OUT LABEL [ADAPTER] [MODES]
#   bench/learning_curve_gpu.sh qwen2.5-coder-0.5b-instruct-q4_k_m.gguf test.jsonl out base
set -euo pipefail
model=$1 tasks=$2 out=$3 label=$4 adapter=${5:-} modes=${6:-zero_shot,full_rewrite,bon,mcts}
python=${PYTHON:-python3}
work=${WORK:-/tmp/curve-gpu}
mkdir -p "$out" "$work"
"$python" bench/learning_curve.py --write-eval-config "$work/curve-eval.yaml"
for mode in ${modes//,/ }; do
  start=$(date +%s)
  CODEQ_POLICY__QUANTIZATION=none "$python" -m codeq evaluate "$tasks" -c "$work/curve-eval.yaml" \
    --model "$model" ${adapter:+--adapter "$adapter"} --modes "$mode" --out "$work/$label-$mode"
  cp "$work/$label-$mode/results.json" "$out/$label-$mode.json"
  echo "$label $mode $(($(date +%s) - start)) s" | tee -a "$out/times.txt"
done
