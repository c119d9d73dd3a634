"""Our attention, plugged into a transformers model for the calls the engine makes itself.

The model's own modules compute everything (embeddings, projections, rotary positions, MLPs);
only the attention over keys and values is ours, because only we know how a batch shares its
KV: `PromptBatch` reads the uncached tails of many prompts in one forward, each after its own
cached prefix; `DecodeBatch` decodes many sequences that keep their prompts' KV once. Both
implement `attend(layer, query, key, value, scaling)`, and the model is called with `kv_batch=`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

ATTENTION_NAME = "codeq_kv_batch"


class KVBatch(Protocol):
    def attend(self, layer: int, query: Any, key: Any, value: Any, scaling: float) -> Any: ...


def kv_batch_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    kv_batch: KVBatch | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """A transformers attention function: [B, heads, q, d] in, [B, q, heads, d] out."""
    if kv_batch is None:
        raise RuntimeError("codeq's attention needs the model to be called with kv_batch=")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return kv_batch.attend(module.layer_idx, query, key, value, scale), None


@contextmanager
def batch_attention(model: Any) -> Iterator[None]:
    """While inside, the model attends through `kv_batch` (so every call must pass one)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, kv_batch_attention)
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
