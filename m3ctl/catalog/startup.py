"""Schema and loader of m3ctl/data/startup.yaml: what a vLLM start logs and which measures shorten it (used by the
tune's start measures, m3ctl/tuning/startup.py, and the prewarmed server processes, m3ctl/runtime/prewarm.py)."""

from __future__ import annotations

from m3ctl.catalog.loader import Regex, _Strict
from m3ctl.catalog.registry import data, register


class _Marker(_Strict):
    phase: str
    regex: Regex
    source: str


class _CaptureBound(_Strict):
    flag: str
    key: str
    default_cap: int
    conflicts: list[str]
    source: str


class _EngineProcess(_Strict):
    env: str
    value: str
    forced_spawn: str
    source: str


class _KernelCache(_Strict):
    env: str
    folder: str
    aot_env: str
    aot_value: str
    torch_default: str
    source: str


class _Prewarm(_Strict):
    imports: list[str]
    late_env: list[str]
    wrapper: Regex
    source: str


class StartupFacts(_Strict):
    """Schema of m3ctl/data/startup.yaml."""

    markers: list[_Marker]
    compile_cache_hit: Regex
    cache_root_env: str
    capture_bound: _CaptureBound
    engine_process: _EngineProcess
    kernel_cache: _KernelCache
    prewarm: _Prewarm


register("data/startup.yaml", StartupFacts)


def facts() -> StartupFacts:
    """m3ctl/data/startup.yaml, validated (a schema error names the field: m3ctl.catalog)."""
    return data("data/startup.yaml", StartupFacts)
