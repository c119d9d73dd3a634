"""The one seam between the policy's users and what generates its requests (`policy.backend`).

Every backend takes `GenerationRequest`s and gives `GenerationResult`s with the same meaning:
n samples of one prompt, sample k of a seeded request drawn from its own generator, the stop
rules ('code', 'score', 'none'), the answer prefix, a continued conversation reusing the KV of
what it continues, token counts and seconds. Each has `generate(requests)`, `stream()` (submit,
step, busy), `clear_prefix_cache()`, `name`, `stats` and `backend`. Search, critique, evaluation
and the benchmarks call `load_policy` and never ask which one runs.

  engine        CodeQ's own continuous batching (engine.py, stream.py)
  transformers  transformers' continuous batching (transformers_backend.py)
  vllm          vLLM, CUDA only, an optional extra (vllm_backend.py)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from codeq.errors import ConfigError

if TYPE_CHECKING:
    from codeq.config import PolicyConfig

BACKENDS = ("engine", "transformers", "vllm")
AUTO = "engine"  # what 'auto' picks: the fastest backend measured so far on both CPU and GPU
# (docs/performance.md); the engine until a GPU run of bench/device_check.sh says otherwise


def resolve_backend(config: PolicyConfig) -> str:
    """The backend `config` names ('auto' resolved), or ConfigError listing them."""
    name = config.backend
    if name == "auto":
        return AUTO
    if name not in BACKENDS:
        raise ConfigError(
            f"unknown policy.backend {name!r}",
            hint=f"choose one of: auto, {', '.join(BACKENDS)}",
        )
    return name


def check_backend(config: PolicyConfig) -> str:
    """The resolved backend, after checking it can run here (vllm: installed, and a CUDA GPU),
    so that a run that cannot sample fails before it loads or starts anything."""
    name = resolve_backend(config)
    if name == "vllm":
        from codeq.policy.vllm_backend import check_vllm

        check_vllm(config)
    return name


def load_policy(config: PolicyConfig, *, seed: int | None = None) -> Any:
    """Load the policy with the backend `config.backend` names."""
    name = check_backend(config)
    if name == "transformers":
        from codeq.policy.transformers_backend import TransformersPolicy

        return TransformersPolicy.load(config, seed=seed)
    if name == "vllm":
        from codeq.policy.vllm_backend import VllmPolicy

        return VllmPolicy.load(config, seed=seed)
    from codeq.policy.engine import PolicyEngine

    return PolicyEngine.load(config, seed=seed)


def available_backends(config: PolicyConfig) -> list[str]:
    """The backends that can run here with `config` (vllm needs the package and CUDA)."""
    found = []
    for name in BACKENDS:
        try:
            check_backend(config.model_copy(update={"backend": name}))
        except ConfigError:
            continue
        found.append(name)
    return found
