"""CodeQ: a self-improving code-debugging agent (MCTS + sandboxed tests + DPO with LoRA)."""

import logging

__version__ = "0.1.0"


class _DropOptionalKernelNotice(logging.Filter):
    """bitsandbytes (imported by peft and trl) warns on every import, on CPUs with AVX512-BF16,
    that its optional `kernels` package for 4-bit CPU matmuls is missing. CodeQ never runs 4-bit
    on CPU (policy.quantization=nf4 there is a ConfigError), so only that notice is dropped;
    every other bitsandbytes message still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "from kernels-community" not in record.getMessage()


logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_DropOptionalKernelNotice())
