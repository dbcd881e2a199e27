"""Offline / air-gapped launches: every hub reference of a plan (model, ``--tokenizer``, the draft model of
``--speculative-config``) resolved to its local snapshot and checked file by file before anything starts.

The snapshot is found the way huggingface_hub stores it: ``<hub cache>/models--ORG--NAME/refs/<revision>`` holds
the commit, ``snapshots/<commit>/`` the files (symlinks into ``blobs/``); the hub cache is ``HF_HUB_CACHE``, else
``HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (huggingface.co/docs/huggingface_hub/guides/manage-cache).
Checked: ``config.json``; a tokenizer (``tokenizer.json``, ``tokenizer.model`` or ``tokenizer_config.json``
with a vocabulary file); weights: ``model.safetensors``, or ``model.safetensors.index.json`` and every shard its
``weight_map`` names, each a non-empty file, together at least the index's ``metadata.total_size`` bytes (the
tensor bytes; each shard adds its header). The plan then passes paths, and sets ``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1`` (huggingface_hub and transformers environment variables) so nothing reaches out.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from m3ctl.errors import ConfigRejected
from m3ctl.hw.host import model_cache_dir, snapshot_path
from m3ctl.planning.launch import serve_command

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def offline_requested(environ: dict[str, str] | None = None) -> bool:
    """True when ``HF_HUB_OFFLINE`` is set to a true value (``1``, ``true``, ``yes``, ``on``)."""
    env = os.environ if environ is None else environ
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_cache(environ: dict[str, str] | None = None) -> Path:
    """The huggingface_hub cache directory (:func:`m3ctl.hw.host.model_cache_dir`)."""
    return model_cache_dir(os.environ if environ is None else environ)


def snapshot_dir(repo_id: str, revision: str = "main", environ: dict[str, str] | None = None) -> Path:
    """The local snapshot directory of hub model ``repo_id`` at ``revision`` (:func:`m3ctl.hw.host.snapshot_path`).

    Raises:
        ConfigRejected: the model is not in the cache (offline, nothing can be downloaded).
    """
    snap = snapshot_path(repo_id, revision, environ)
    if snap is None:
        raise ConfigRejected(
            f"offline: {repo_id} (revision {revision}) is not in the HF cache {hub_cache(environ)}",
            f"download it where there is network (`hf download {repo_id}`), copy the cache here, "
            "or point HF_HUB_CACHE / HF_HOME at it",
        )
    return snap


def _need(path: Path, what: str, repo: str) -> None:
    if not path.is_file():  # also a dangling symlink into blobs/ (an interrupted download)
        raise ConfigRejected(
            f"offline: {what} {path} of {repo} is missing",
            f"download {repo} again where there is network and copy the whole snapshot",
        )


def check_snapshot(path: Path, repo: str, weights: bool = True, tokenizer: bool = True) -> None:
    """Check a local model directory for what vLLM reads: config, (``tokenizer``) a tokenizer and (``weights``)
    every shard.

    Raises:
        ConfigRejected: a file is missing, empty or the shards are smaller than the index says; names the file.
    """
    _need(path / "config.json", "config", repo)
    toks = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    if tokenizer and not any((path / t).is_file() for t in toks):
        _need(path / toks[0], "tokenizer", repo)
    if not weights:
        return
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        _need(path / "model.safetensors", "weights", repo)
        return
    try:
        idx = json.loads(index.read_text())
        shards = sorted(set(idx["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigRejected(
            f"offline: safetensors index {index} of {repo} is unreadable ({e})", "download the model again"
        ) from None
    total = 0
    for s in shards:
        f = path / s
        _need(f, "weight shard", repo)
        size = f.stat().st_size
        if size == 0:
            raise ConfigRejected(f"offline: weight shard {f} of {repo} is empty", "download the model again")
        total += size
    want = int((idx.get("metadata") or {}).get("total_size") or 0)
    if total < want:
        raise ConfigRejected(
            f"offline: the {len(shards)} shard(s) of {repo} hold {total} bytes, less than the "
            f"{want} bytes of tensors {index.name} lists (a truncated download)",
            "download the model again",
        )


def _local(ref: str, revision: str, weights: bool, environ, tokenizer: bool = True) -> Path:
    p = Path(ref).expanduser()
    if p.is_dir():
        check_snapshot(p, ref, weights, tokenizer)
        return p.resolve()
    snap = snapshot_dir(ref, revision, environ)
    check_snapshot(snap, ref, weights, tokenizer)
    return snap


def _spec(args: dict[str, Any]) -> dict[str, Any]:
    """The ``--speculative-config`` of ``args`` as a dict (given as JSON text or a dict); empty without one."""
    spec = args.get("speculative-config")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            spec = None
    return spec if isinstance(spec, dict) else {}


def resolve_offline(plan, environ: dict[str, str] | None = None):
    """``plan`` (a :class:`~m3ctl.planning.plan.LaunchPlan`) with its model, tokenizer and draft model as checked local
    snapshots, the offline variables set, and the paths recorded for read-only mounts. The served model names
    stay the hub ids clients send.

    Raises:
        ConfigRejected: a reference is not cached, or a file vLLM needs is missing (named).
    """
    args: dict[str, Any] = dict(plan.vllm_args or {})
    # ``--load-format dummy`` initialises random weights and reads no weight file (vLLM LoadFormat "dummy",
    # https://docs.vllm.ai/en/latest/configuration/engine_args.html#-load-format): config and tokenizer only.
    weights = str(args.get("load-format") or "").lower() != "dummy"
    model = _local(plan.model, str(args.get("revision") or "main"), weights, environ)
    local_paths: list[str] = []
    tok = args.get("tokenizer")
    if isinstance(tok, str) and tok:
        args["tokenizer"] = str(_local(tok, str(args.get("tokenizer-revision") or "main"), False, environ))
        local_paths.append(args["tokenizer"])
    spec = _spec(args)
    if isinstance(spec.get("model"), str) and spec["model"]:
        # A draft model reads the target's tokenizer (vLLM SpeculativeConfig builds the draft ModelConfig with
        # tokenizer=target_model_config.tokenizer unless the vocabularies differ; vllm/config/speculative.py,
        # https://github.com/vllm-project/vllm/blob/main/vllm/config/speculative.py): it needs none of its own.
        draft = _local(spec["model"], str(spec.get("revision") or "main"), weights, environ, tokenizer=False)
        args["speculative-config"] = {**spec, "model": str(draft)}
        local_paths.append(str(draft))
    served = [plan.served_model_name, *plan.served_model_aliases]
    argv = [plan.argv[0], *serve_command(str(model), plan.host, plan.port, served, args)]
    return plan.model_copy(
        update={
            "model": str(model),
            "argv": argv,
            "vllm_args": args,
            "offline": True,
            "env": {**plan.env, **OFFLINE_ENV},
            "local_paths": local_paths,
        }
    )


def offline_on_target(plan):
    """``plan`` for a catalog system (``target_system``) run offline: the offline variables set and the hub references
    kept, for the target host's HF cache to resolve (vLLM and transformers read the cache themselves under
    ``HF_HUB_OFFLINE=1``, https://huggingface.co/docs/huggingface_hub/package_reference/environment_variables#hfhuboffline);
    this machine's cache is not the target's, so it is not checked, and a warning names what the target's must hold."""
    args = plan.vllm_args or {}
    refs = [plan.model, args.get("tokenizer"), _spec(args).get("model")]
    held = ", ".join(dict.fromkeys(r for r in refs if isinstance(r, str) and r))
    note = f"offline: the HF cache on the {plan.target_system} host must hold {held} (this machine's is not checked)"
    return plan.model_copy(
        update={"offline": True, "env": {**plan.env, **OFFLINE_ENV}, "warnings": [*plan.warnings, note]}
    )


def on_target_cache(plan) -> bool:
    """``plan`` reads its hub references from another host's HF cache: planned for a catalog system
    (``target_system``) with a hub model, not a local directory (a directory given here is this machine's, checked
    here as for this host)."""
    return bool(plan.target_system) and not Path(plan.model).expanduser().is_dir()


def resolve_if_offline(plan, offline: bool | None = None):
    """``plan`` resolved to checked local snapshots (:func:`resolve_offline`) when ``offline`` is True, or is None
    and ``HF_HUB_OFFLINE`` is set (:func:`offline_requested`); else ``plan`` itself. A plan for a catalog system's
    HF cache (:func:`on_target_cache`) is marked offline for that cache instead (:func:`offline_on_target`).

    Raises:
        ConfigRejected: as :func:`resolve_offline`.
    """
    if not (offline if offline is not None else offline_requested()):
        return plan
    return offline_on_target(plan) if on_target_cache(plan) else resolve_offline(plan)
