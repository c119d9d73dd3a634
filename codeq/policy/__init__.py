"""The policy: model loading, batched generation, prompts, program extraction, critique."""

from codeq.policy.engine import (
    GenerationRequest,
    GenerationResult,
    PolicyEngine,
    cpu_supports_bf16,
    resolve_device,
    resolve_dtype,
    resolve_quantization,
)

__all__ = [
    "GenerationRequest",
    "GenerationResult",
    "PolicyEngine",
    "cpu_supports_bf16",
    "resolve_device",
    "resolve_dtype",
    "resolve_quantization",
]
