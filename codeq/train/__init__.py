"""DPO training with a LoRA adapter, and merging the adapter into its base model."""

from codeq.train.dpo import train_dpo
from codeq.train.merge import merge_adapter
from codeq.train.model import resolve_model_source

__all__ = ["merge_adapter", "resolve_model_source", "train_dpo"]
