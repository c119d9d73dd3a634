"""DPO training with a LoRA adapter, and merging the adapter into its base model."""

from codeq.train.dpo import train_dpo
from codeq.train.merge import merge_adapter

__all__ = ["merge_adapter", "train_dpo"]
