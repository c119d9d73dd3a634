"""bf16 against float32 on this CPU, at Qwen2.5-Coder-0.5B's linear shapes.

`policy.dtype: auto` and `train.precision: bf16` pick bf16 on a CPU that reports native bf16
dot products (AVX512-BF16 or AMX: codeq.policy.engine.cpu_supports_bf16). Whether bf16 is then
faster depends on the CPU: without AMX tiles, oneDNN's bf16 matmul can be slower than float32
where the work is compute-bound (prompt reading, training), while decoding a few rows reads
half the bytes. This prints, per shape and pass, float32 seconds / bf16 seconds (above 1: bf16
faster), the arms interleaved ABBA in one run so that a busy machine slows both alike.

    .venv/bin/python bench/cpu_dtype.py [--threads 2] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

HIDDEN, INTERMEDIATE = 896, 4864  # Qwen2.5-Coder-0.5B's MLP: the bulk of its FLOPs
ROWS = {"decode, 8 rows": 8, "decode, 64 rows": 64, "prompt or training, 1024 rows": 1024}


def one_pass(x: object, w: object, backward: bool) -> float:
    import torch

    began = time.perf_counter()
    if backward:
        torch.nn.functional.linear(x, w).sum().backward()  # type: ignore[arg-type]
    else:
        with torch.inference_mode():
            torch.nn.functional.linear(x, w)  # type: ignore[arg-type]
    return time.perf_counter() - began


def measure(rows: int, backward: bool, repeats: int) -> dict[str, float]:
    import torch

    arms = {
        name: (
            torch.randn(rows, HIDDEN, dtype=dtype, requires_grad=backward),
            torch.randn(INTERMEDIATE, HIDDEN, dtype=dtype, requires_grad=backward),
        )
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16))
    }
    inner = max(1, 256 // rows)  # enough work per timing for small shapes
    spent = {name: 0.0 for name in arms}
    for x, w in arms.values():  # warm-up, untimed
        one_pass(x, w, backward)
    for repeat in range(repeats):
        order = list(arms) if repeat % 2 == 0 else list(reversed(arms))  # ABBA
        for name in order:
            spent[name] += sum(one_pass(*arms[name], backward) for _ in range(inner))
    return {
        "float32_ms": 1000 * spent["float32"] / (repeats * inner),
        "bfloat16_ms": 1000 * spent["bfloat16"] / (repeats * inner),
        "float32_over_bfloat16": spent["float32"] / spent["bfloat16"],
    }


def main() -> None:
    import torch

    from codeq.policy.engine import cpu_supports_bf16

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    print(
        f"torch {torch.__version__}, {args.threads} thread(s); cpu_supports_bf16: "
        f"{cpu_supports_bf16()}, AMX tiles: {amx}"
    )
    rows = []
    for label, count in ROWS.items():
        for backward in (False, True) if count == 1024 else (False,):
            result = measure(count, backward, args.repeats)
            pass_name = "forward + backward" if backward else "forward"
            rows.append({"shape": label, "pass": pass_name, **result})
            print(
                f"{label:>31} {pass_name:>18}: float32 {result['float32_ms']:8.2f} ms, "
                f"bf16 {result['bfloat16_ms']:8.2f} ms, float32/bf16 "
                f"{result['float32_over_bfloat16']:.2f}x",
                flush=True,
            )
    if args.out:
        machine = {"cpu": cpu_model(), "torch": torch.__version__}
        args.out.write_text(
            json.dumps({**machine, "threads": args.threads, "amx": amx, "rows": rows}, indent=1)
        )


def cpu_model() -> str:
    """The CPU's model name (the answer differs between CPUs of one instruction set)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
