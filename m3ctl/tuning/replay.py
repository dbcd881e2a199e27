"""Replay evaluation: answers the search from a recorded grid of real measurements (no server).

Grid file (benchmarks/tune_efficiency.py ``--record``; tests/fixtures/tune_grid_cpu.json)::

    {"meta": {...}, "ladder": [1, 2, 4, ...],
     "configs": [{"config": {...}, "status": "ok" | "crashed" | "rejected", "reason": str,
                  "start_s": float, "points": {"<concurrency>": {bench result keys...}}}],
     "baseline": {same shape as a configs entry: vLLM's defaults, optional}}

A grid without ``baseline`` replays a study that asked for one as "baseline skipped" with the reason.
A concurrency may also hold a list of results (repeated runs of one level, in the order they were measured):
the n-th run at that concurrency on one server replays the n-th entry, cycling (the search repeats runs near
the SLO boundary; a single result answers every repeat the same).

The cost of a replayed run is the recorded server start and run durations, so replays count cost in
the same units as the grid: server starts x run time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from m3ctl.errors import ConfigRejected, LaunchFailed
from m3ctl.tuning.space import Space, key_of


class ReplaySession:
    def __init__(self, rec: dict, clock: list[float]):
        self.rec, self.start_s, self.clock = rec, float(rec.get("start_s", 0.0)), clock
        self.count: dict[int, int] = {}  # runs made per concurrency on this server
        clock[0] += self.start_s

    def measure(self, concurrency: int, fidelity: float) -> dict:
        res = self.rec["points"].get(str(concurrency))
        if res is None:
            raise LaunchFailed(f"no recorded run at concurrency {concurrency}", "record the grid with this ladder")
        n = self.count.get(concurrency, 0)
        self.count[concurrency] = n + 1
        res = dict(res[n % len(res)] if isinstance(res, list) else res)
        res["duration"] = float(res.get("duration", 0.0)) * fidelity
        self.clock[0] += res["duration"]
        return res

    def close(self) -> None:
        pass


class ReplayEvaluator:
    def __init__(self, grid: dict):
        self.grid = grid
        self.by_key = {key_of(c["config"]): c for c in grid["configs"]}
        for ref in ("baseline", "recipe"):
            if grid.get(ref):
                self.by_key[key_of(grid[ref]["config"])] = grid[ref]
        self.clock = [0.0]
        self.opened = 0

    @classmethod
    def load(cls, path: Path) -> ReplayEvaluator:
        return cls(json.loads(Path(path).read_text()))

    def _rec(self, cand: dict[str, Any]) -> dict:
        rec = self.by_key.get(key_of(cand))
        if rec is None:
            raise KeyError(f"candidate not in the recorded grid: {cand}")
        return rec

    def check(self, cand: dict[str, Any]) -> None:
        rec = self._rec(cand)
        if rec["status"] == "rejected":
            raise ConfigRejected(rec.get("reason", "rejected"), "recorded")

    def open(self, cand: dict[str, Any], trial: int | str, on_event: Callable[[str], None]) -> ReplaySession:
        rec = self._rec(cand)
        self.opened += 1
        if rec["status"] == "crashed":
            self.clock[0] += float(rec.get("start_s", 0.0))
            e = LaunchFailed(rec.get("reason", "crashed"), "recorded")
            e.elapsed_s = float(rec.get("start_s", 0.0))
            raise e
        return ReplaySession(rec, self.clock)

    def n_gpus(self, cand: dict[str, Any]) -> int:
        return 1

    def baseline_candidate(self) -> tuple[dict[str, Any] | None, str]:
        """The recorded vLLM-defaults configuration, or None and why there is none."""
        if self.grid.get("baseline"):
            return dict(self.grid["baseline"]["config"]), ""
        return None, (
            "the recorded grid has no vLLM-defaults entry (record one with benchmarks/tune_efficiency.py --record)"
        )

    def recipe_candidate(self) -> tuple[dict[str, Any] | None, str]:
        """The recorded recipe-stack configuration (grid key ``recipe``), or None and why there is none."""
        if self.grid.get("recipe"):
            return dict(self.grid["recipe"]["config"]), ""
        return None, "the recorded grid has no recipe-stack entry"

    def command(self, cand: dict[str, Any]) -> str:
        return json.dumps(cand)


def recorded_space(grid: dict):
    """The grid's space narrowed to values whose every combination was recorded (a partial recording
    is cut to its complete sub-grid by dropping, one at a time, the knob value with the most gaps)."""

    space = Space.from_json(grid["space"])
    have = {key_of(c["config"]) for c in grid["configs"]}
    while True:
        missing = [c for c in space.grid() if key_of(c) not in have]
        if not missing:
            return space
        worst = max(
            ((k, v) for k in space.free() for v in space.values[k]),
            key=lambda kv: (
                sum(1 for c in missing if c[kv[0]] == kv[1]) / sum(1 for c in space.grid() if c[kv[0]] == kv[1])
            ),
        )
        space.values[worst[0]] = [v for v in space.values[worst[0]] if v != worst[1]]
