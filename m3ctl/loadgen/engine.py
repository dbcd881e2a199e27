"""The engine behind a bench run's deployment: is it dead, and marking a result whose engine died.

A bench of an m3ctl deployment (``BenchConfig.deployment``) asks m3ctl.serving.lifecycle about its engine when
requests fail or the server goes away, so the error and the result name the death (when, how, why).
"""

from __future__ import annotations

from pathlib import Path

from m3ctl.core.state import Registry
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.validity import settle
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
