"""Scripted engines for unit tests of what surrounds the model (never in place of a real one):
every critique says 5/10 unless `critique` says otherwise, and each rewrite request's samples
are the programs `samples` returns, fenced as a model writes them."""

from __future__ import annotations

from collections.abc import Sequence

from codeq.policy import GenerationRequest, GenerationResult
from codeq.policy.prompts import fenced
from codeq.schemas import Task


def prompt_text(request: GenerationRequest) -> str:
    return "\n".join(message.content for message in request.messages)


class ScriptedEngine:
    name = "scripted"

    def samples(self, request: GenerationRequest) -> list[str]:
        """The request's `n` programs."""
        raise NotImplementedError

    def critique(self, request: GenerationRequest) -> str:
        return "Score: 5/10"

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        results = []
        for request in requests:
            if request.stop == "score":
                texts = [self.critique(request)] * request.n
            else:
                texts = [fenced(program) for program in self.samples(request)]
            results.append(
                GenerationResult(texts=texts, prompt_tokens=1, completion_tokens=[1] * len(texts))
            )
        return results


class TaskScriptedEngine(ScriptedEngine):
    """A scripted engine that answers by task: `task_of` finds the task a prompt is about."""

    def __init__(self, tasks: Sequence[Task]) -> None:
        self.tasks = list(tasks)

    def task_of(self, request: GenerationRequest) -> Task:
        text = prompt_text(request)
        matches = [task for task in self.tasks if task.buggy_code.strip() in text]
        return max(matches, key=lambda task: len(task.buggy_code))


class CyclingAnswers(ScriptedEngine):
    """Each rewrite request's samples go through `programs` in order (the first sample gets
    the first)."""

    def __init__(self, programs: Sequence[str], name: str = "cycling-answers") -> None:
        self.programs, self.name = list(programs), name

    def samples(self, request: GenerationRequest) -> list[str]:
        return [self.programs[i % len(self.programs)] for i in range(request.n)]
