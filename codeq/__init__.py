"""CodeQ: a self-improving code-debugging agent (MCTS + sandboxed tests + DPO with LoRA)."""

__version__ = "0.1.0"
