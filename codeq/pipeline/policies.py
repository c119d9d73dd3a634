"""The policy a round runs with, read from and written to the store.

`runs/<run>/current/CURRENT.json` names the promoted policy as a lineage (base model + the
adapters promoted so far, each with its round, sha256 and store prefix); before any promotion
the policy is the configured base model. A stage turns a lineage into a loadable model folder by
downloading its adapters (checked against their manifests and sha256) and merging them once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from codeq.config import CodeQConfig
from codeq.errors import BadInputError, ConfigError, CorruptInputError
from codeq.logs import log
from codeq.pipeline.context import StageContext
from codeq.policy.source import is_adapter_dir
from codeq.schemas import Lineage
from codeq.store import join_key

CURRENT_INFO = "CURRENT.json"


def base_policy(ctx: StageContext) -> Lineage:
    from codeq.train.lineage import base_lineage

    key = f"base:{ctx.config.policy.model}"
    if key not in ctx.lineages:
        ctx.lineages[key] = base_lineage(ctx.config.policy)
    return ctx.lineages[key]


def current_policy(ctx: StageContext) -> Lineage:
    """The policy this round starts from: the one promoted by the run's earlier rounds (the
    base model before any promotion). Refuses a run whose recorded base is not the configured
    model: its adapters fit only that base."""
    base = base_policy(ctx)
    key = join_key(ctx.layout.current, CURRENT_INFO)
    if not ctx.store.exists(key):
        return base
    info = ctx.store.get_json(key)
    try:
        current = Lineage.model_validate(info["policy"])
        promoted_in = int(info.get("round", -1))
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptInputError(
            f"{ctx.store.describe(key)} names no policy lineage ({type(exc).__name__})",
            hint="promote a round again, or start a new run (store.run)",
        ) from None
    if promoted_in >= ctx.layout.round:
        # This round (or a later one) promoted already: a forced rerun of one of its stages
        # starts from what the earlier rounds promoted, read from their decisions.
        current = promoted_before(ctx) or base
    if (current.base_model, current.base_sha256) != (base.base_model, base.base_sha256):
        raise ConfigError(
            f"run {ctx.layout.run!r} builds on base model {current.base_model} "
            f"({current.base_sha256[:12]}), but policy.model is {base.base_model} "
            f"({base.base_sha256[:12]})",
            hint="keep the run's base model, or start a new run (store.run)",
        )
    return current


def promoted_before(ctx: StageContext) -> Lineage | None:
    """The candidate of the latest round before this one whose promotion decision promoted."""
    from codeq.promotion import PromotionDecision

    for number in range(ctx.layout.round - 1, -1, -1):
        prefix = ctx.layout.of_round(number).stage("promote")
        if not ctx.store.is_complete(prefix) or not ctx.store.marker(prefix).get("promote"):
            continue
        target = ctx.scratch / "promoted-before" / f"round-{number}.json"
        if not ctx.store.get_verified_file(prefix, "decision.json", target):
            raise CorruptInputError(
                f"{ctx.store.describe(prefix)} holds no decision.json",
                hint=f"rerun round {number}'s promote stage",
            )
        decision = PromotionDecision.model_validate_json(target.read_text())
        if decision.candidate is not None:
            return decision.candidate
    return None


def current_pointer_round(ctx: StageContext) -> int | None:
    """The round that last wrote runs/<run>/current (None before any promotion)."""
    key = join_key(ctx.layout.current, CURRENT_INFO)
    if not ctx.store.exists(key):
        return None
    info = ctx.store.get_json(key)
    return int(info.get("round", -1)) if isinstance(info, dict) else None


def set_current(ctx: StageContext, policy: Lineage) -> None:
    """Make `policy` the run's promoted policy (one object, replaced atomically)."""
    ctx.store.put_json(
        join_key(ctx.layout.current, CURRENT_INFO),
        {"round": ctx.layout.round, "policy": policy.model_dump(mode="json")},
    )


def fetch_adapters(ctx: StageContext, policy: Lineage) -> list[Path]:
    """Download every adapter of the lineage (manifest-checked) into the scratch folder."""
    folders = []
    for link in policy.adapters:
        ctx.store.require_complete(link.source, f"round {link.round}'s adapter")
        target = ctx.scratch / "adapters" / f"round-{link.round}-{link.sha256[:12]}"
        if not is_adapter_dir(target):
            ctx.store.get_dir(link.source, target)
        folders.append(target)
    return folders


def policy_config(ctx: StageContext, policy: Lineage) -> CodeQConfig:
    """The config with policy.model pointing at a folder that loads as `policy`."""
    from codeq.train.lineage import materialize

    if policy.adapters:
        log(f"policy: {policy.describe()}")
    if policy.adapters and ctx.config.store.keep_merged:
        model = shared_merge(ctx, policy)
    else:
        model = materialize(policy, fetch_adapters(ctx, policy), ctx.config.policy)
    return ctx.config.model_copy(
        update={"policy": ctx.config.policy.model_copy(update={"model": model, "adapter": None})}
    )


MERGE_CLAIM = "_CLAIM.json"
STALE_CLAIM_S = 6 * 3600  # a claimant silent this long was preempted mid-upload


def shared_merge(ctx: StageContext, policy: Lineage) -> str:
    """A folder that loads as `policy`, merged once per run: (1) one this pod made already,
    (2) else the run's copy in the store (runs/<run>/merged/<name>, complete and checked),
    (3) else merged here and uploaded for every later stage and shard, by the first pod that
    claims the upload; the others keep their own merge."""
    from codeq.train.lineage import holds_merge, materialize, merged_target

    target = merged_target(policy, ctx.config.policy)
    prefix = ctx.layout.merged(target.name)
    # 1. merged in this pod (or on this node's cache) before
    if holds_merge(target, policy):
        return str(target)
    # 2. merged by an earlier stage or shard
    if ctx.store.is_complete(prefix):
        _download_merge(ctx, prefix, target)
        if holds_merge(target, policy):
            log(f"policy: the merged {policy.id} from {ctx.store.describe(prefix)}")
            return str(target)
        raise CorruptInputError(
            f"{ctx.store.describe(prefix)} does not hold the merge of {policy.id}",
            hint=f"delete {ctx.store.describe(prefix)}; the next stage merges it again",
        )
    # 3. merged here, then kept in the store
    model = materialize(policy, fetch_adapters(ctx, policy), ctx.config.policy)
    if _claim_upload(ctx, prefix):
        log(f"policy: keeping the merged {policy.id} in {ctx.store.describe(prefix)}")
        manifest = ctx.store.put_dir(prefix, Path(model))
        size = sum(entry["bytes"] for entry in manifest["files"].values())
        ctx.store.mark_complete(prefix, {"lineage": policy.id, "bytes": size})
    return model


def _download_merge(ctx: StageContext, prefix: str, target: Path) -> None:
    """Into a sibling folder first, renamed when every file checked: a download cut off
    midway never looks like a finished merge."""
    import shutil

    partial = target.with_name(f"{target.name}.download")
    shutil.rmtree(partial, ignore_errors=True)
    ctx.store.get_dir(prefix, partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _claim_upload(ctx: StageContext, prefix: str) -> bool:
    """Whether this pod uploads the merge: the first to write the claim does; a claim older
    than STALE_CLAIM_S (its pod gone before the marker) is taken over."""
    import socket
    import time

    key = join_key(prefix, MERGE_CLAIM)
    claim = {"claimed_at": time.time(), "host": socket.gethostname(), "round": ctx.layout.round}
    body = json.dumps(claim).encode()
    if ctx.store.create_only(key, body):
        return True
    try:
        claimed_at = float(ctx.store.get_json(key).get("claimed_at", 0))
    except (BadInputError, OSError, AttributeError, TypeError, ValueError):
        claimed_at = 0.0  # unreadable or gone: as stale
    if time.time() - claimed_at < STALE_CLAIM_S:
        log(f"policy: another stage keeps this merge in {ctx.store.describe(prefix)}")
        return False
    ctx.store.delete(key)
    return ctx.store.create_only(key, body)


def load_policy(ctx: StageContext, policy: Lineage) -> Any:
    """A generation engine for `policy`, loaded once per lineage and shared by the stages of a
    local round."""
    if policy.id not in ctx.engines:
        from codeq.policy import load_policy as load_backend

        config = policy_config(ctx, policy)
        log(f"loading the policy {policy.describe()}")
        ctx.engines[policy.id] = load_backend(config.policy, seed=config.tasks.seed)
    return ctx.engines[policy.id]
