"""Scripted engines for unit tests of what surrounds the model (never in place of a real one)."""

from __future__ import annotations

from collections.abc import Sequence

from codeq.policy import GenerationRequest, GenerationResult


class CyclingAnswers:
    """Each rewrite request's samples go through `programs` in order (the first sample gets the
    first); every critique says 5/10."""

    def __init__(self, programs: Sequence[str], name: str = "cycling-answers") -> None:
        self.programs, self.name = list(programs), name

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = []
        for request in requests:
            if request.stop == "score":
                texts = ["Score: 5/10"] * request.n
            else:
                texts = [
                    f"```python\n{self.programs[i % len(self.programs)]}```"
                    for i in range(request.n)
                ]
            results.append(
                GenerationResult(texts=texts, prompt_tokens=1, completion_tokens=[1] * request.n)
            )
        return results
