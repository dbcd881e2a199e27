"""Schema and loader of m3ctl/data/startup.yaml: what a vLLM start logs and which measures shorten it (used by the
tune's start measures, m3ctl/tuning/startup.py, and the prewarmed server processes, m3ctl/runtime/prewarm.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from m3ctl.catalog import Regex


class _Marker(BaseModel):
    model_config = ConfigDict(extra="forbid")
    phase: str
    regex: Regex
    source: str


class _CaptureBound(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flag: str
    key: str
    default_cap: int
    conflicts: list[str]
    source: str


class _EngineProcess(BaseModel):
    model_config = ConfigDict(extra="forbid")
    env: str
    value: str
    forced_spawn: str
    source: str


class _KernelCache(BaseModel):
    model_config = ConfigDict(extra="forbid")
    env: str
    folder: str
    aot_env: str
    aot_value: str
    torch_default: str
    source: str


class _Prewarm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    imports: list[str]
    late_env: list[str]
    wrapper: Regex
    source: str


class StartupFacts(BaseModel):
    """Schema of m3ctl/data/startup.yaml."""

    model_config = ConfigDict(extra="forbid")
    markers: list[_Marker]
    compile_cache_hit: Regex
    cache_root_env: str
    capture_bound: _CaptureBound
    engine_process: _EngineProcess
    kernel_cache: _KernelCache
    prewarm: _Prewarm


def facts() -> StartupFacts:
    """m3ctl/data/startup.yaml, validated (a schema error names the field: m3ctl.catalog)."""
    from m3ctl.catalog import data  # noqa: PLC0415

    return data("data/startup.yaml", StartupFacts)
