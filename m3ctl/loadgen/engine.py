"""The engine behind a bench run's deployment: is it dead, and marking a result whose engine died.

A bench of an m3ctl deployment (``BenchConfig.deployment``) asks m3ctl.serving.lifecycle about its engine when
requests fail or the server goes away, so the error and the result name the death (when, how, why), or the stop someone requested (``m3ctl stop``:
:func:`stopped_by`, the one wording a bench and a tune's trial give it).
"""

from __future__ import annotations

from pathlib import Path

from m3ctl.core.state import STOPPING, Registry
from m3ctl.errors import NotFound, UnreadableRecord
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.validity import settle
from m3ctl.serving.diagnose import diagnose_log
from m3ctl.serving.lifecycle import EngineState, check


def engine_death(cfg: BenchConfig) -> dict | None:
    """The death of ``cfg.deployment``'s engine (:meth:`m3ctl.serving.lifecycle.EngineState.to_dict` plus ``sentence``),
    None when it lives, is paused, or no deployment is known. A death seen first here is recorded in its record."""
    if not cfg.deployment:
        return None
    es = check(cfg.deployment, Registry(Path(cfg.state_dir)) if cfg.state_dir else None)
    if es is None or not es.dead:
        return None
    return {**es.to_dict(), "sentence": es.sentence()}


def mark_engine_died(res: dict, died: dict, first_fail_wall: float | None) -> None:
    """Mark a result whose server's engine died: ``engine_died`` (when, how, why), ``server_down``, invalid."""
    if first_fail_wall is not None and (died.get("at") is None or first_fail_wall < died["at"]):
        died = {**died, "at": first_fail_wall}
        es = EngineState(**{k: v for k, v in died.items() if k != "sentence"})
        died["sentence"] = es.sentence()
    res["engine_died"] = died
    res["server_down"] = True
    res.setdefault("not_sent", 0)
    v = res.setdefault("validity", {"valid": False, "reasons": [], "warnings": []})
    v["valid"] = False
    v["reasons"] = [r for r in v.get("reasons", []) if not r.startswith("server generated")]
    v["reasons"].append(f"{died['sentence']}; partial results")
    settle(v)


def stopped_by(name: str, registry: Registry, log_path: str | None) -> str | None:
    """Who stopped deployment ``name``'s server, when its stop was requested from outside the run: its record, there
    when the run started, is gone, or ``m3ctl stop`` marked it :data:`~m3ctl.core.state.STOPPING` (only ``m3ctl stop
    NAME`` / ``--all`` does either to a live deployment; a death keeps the record, phase ``dead``), with the engine's
    own shutdown line when its log ``log_path`` has one (the ``engine-terminated`` diagnosis,
    m3ctl.serving.diagnose). None: not stopped on request."""
    try:
        phase: str | None = registry.get(name).phase
    except UnreadableRecord:  # not a stop that m3ctl asked for
        return None
    except NotFound:  # gone (also between a look and a read: the stop's last step)
        phase = None
    if phase is not None and phase != STOPPING:
        return None
    how = "was removed" if phase is None else "is marked stopping"
    who = f"`m3ctl stop` (its deployment record {name!r} {how})"
    diag = diagnose_log(log_path) if log_path else None
    if diag is not None and diag.id == "engine-terminated":
        who += f"; the engine logged its shutdown on request [{diag.line}]"
    return who


def server_stopped(cfg: BenchConfig) -> dict | None:
    """The requested stop of ``cfg.deployment``'s server (recorded when the run started): ``{name, url, by,
    sentence}``, None when its record is still there or no deployment is known."""
    if not cfg.deployment:
        return None
    who = stopped_by(cfg.deployment, Registry(Path(cfg.state_dir)) if cfg.state_dir else Registry(), cfg.server_log)
    if who is None:
        return None
    sentence = f"the server of deployment {cfg.deployment!r} was stopped during the run by {who}"
    return {"name": cfg.deployment, "url": cfg.url, "by": who, "sentence": sentence}


def mark_server_stopped(res: dict, stopped: dict) -> None:
    """Mark a result whose server was stopped on request: ``server_stopped`` (who, :func:`server_stopped`),
    ``server_down``, invalid (what finished is kept)."""
    res["server_stopped"] = stopped
    res["server_down"] = True
    res.setdefault("not_sent", 0)
    v = res.setdefault("validity", {"valid": False, "reasons": [], "warnings": []})
    v["valid"] = False
    v["reasons"] = [r for r in v.get("reasons", []) if not r.startswith("server generated")]
    v["reasons"].append(f"{stopped['sentence']}; partial results")
    settle(v)
