"""The policy: model loading, batched generation, prompts, program extraction, critique."""
