"""The policy: model loading, batched generation, prompts, program extraction, critique."""

from codeq.policy.backends import BACKENDS, check_backend, load_policy, resolve_backend
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
    "BACKENDS",
    "GenerationRequest",
    "GenerationResult",
    "PolicyEngine",
    "check_backend",
    "cpu_supports_bf16",
    "load_policy",
    "resolve_backend",
    "resolve_device",
    "resolve_dtype",
    "resolve_quantization",
]
