"""The bench verb's shape (issue 38): each option declared once by its BenchConfig field, and the sync and async
entries running one async core."""

from __future__ import annotations

import asyncio

from m3ctl.cli.bench import BENCH_FIELDS
from m3ctl.loadgen import runner
from m3ctl.loadgen.config import BenchConfig


def test_every_bench_option_is_a_declared_field_and_back():
    declared = {f for f, info in BenchConfig.model_fields.items() if "cli" in (info.json_schema_extra or {})}
    assert set(BENCH_FIELDS.values()) == declared
    assert "url" not in declared and "api_key" not in declared  # given apart (--url, the environment)


def test_sync_and_async_entries_share_one_core(monkeypatch):
    seen = []

    async def core(cfg, tok, progress, sync_log, mode, checked=False):
        seen.append((cfg.num_prompts, mode))
        return {"n": cfg.num_prompts}

    monkeypatch.setattr(runner, "_arun", core)
    cfg = BenchConfig(url="http://127.0.0.1:9", model="m", num_prompts=3)
    assert runner.run_bench(cfg) == {"n": 3}
    assert asyncio.run(runner.arun_bench(cfg.model_copy(update={"num_prompts": 4}))) == {"n": 4}
    assert seen == [(3, runner._SYNC), (4, runner._ASYNC)]


def test_run_bench_inside_a_running_loop_uses_a_thread_of_its_own(monkeypatch):
    """A Jupyter cell: the caller's loop is running, so the run gets its own loop in a worker thread."""

    async def core(cfg, tok, progress, sync_log, mode, checked=False):
        return asyncio.get_running_loop()

    monkeypatch.setattr(runner, "_arun", core)
    cfg = BenchConfig(url="http://127.0.0.1:9", model="m")

    async def cell():
        return asyncio.get_running_loop(), runner.run_bench(cfg)

    outer, inner = asyncio.run(cell())
    assert inner is not outer
