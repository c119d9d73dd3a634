"""A training run preempted right after one of its checkpoints reached the store."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import pytest


class Preempted(Exception):
    """Stands in for the pod being killed right after a checkpoint reached the store."""


@contextmanager
def preempted_after_checkpoint(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, step: int
) -> Iterator[None]:
    """Inside, training through `module` (its `upload_checkpoint`) stops with Preempted once
    the checkpoint of `step` is in the store; the block must raise it. Afterwards uploads are
    real again."""
    real_upload = module.upload_checkpoint

    def upload_then_stop(target, checkpoint_dir, at_step):
        real_upload(target, checkpoint_dir, at_step)
        if at_step == step:
            raise Preempted

    monkeypatch.setattr(module, "upload_checkpoint", upload_then_stop)
    try:
        with pytest.raises(Preempted):
            yield
    finally:
        monkeypatch.setattr(module, "upload_checkpoint", real_upload)
