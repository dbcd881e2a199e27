"""Resume keeps what was measured (issue 15, item 6): a tune process SIGKILLed in the middle of a trial, then
resumed. The search is replayed from a recorded grid (m3ctl/tuning/replay.py) in a forked child that kills itself
with SIGKILL when the chosen bench run begins, i.e. after the trial's earlier runs had been written: the real
kill of a GPU call that hits its time limit."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from m3ctl.tuning.replay import ReplayEvaluator
from m3ctl.tuning.search import Tuner, TuneSpec
from m3ctl.tuning.space import key_of
from tests.tuning.test_tune import _itl_landscape


class _Killing(ReplayEvaluator):
    """Counts bench runs; at run number ``kill_at`` it writes its clock to ``clock_file`` and SIGKILLs itself."""

    def __init__(self, grid: dict, kill_at: int | None = None, clock_file: Path | None = None):
        super().__init__(grid)
        self.kill_at, self.clock_file, self.runs = kill_at, clock_file, 0
        self.opened_keys: list[str] = []

    def open(self, cand, trial, on_event):
        sess = super().open(cand, trial, on_event)
        self.opened_keys.append(key_of(cand))
        real = sess.measure

        def measure(c: int, fid: float) -> dict:
            self.runs += 1
            if self.runs == self.kill_at:
                self.clock_file.write_text(repr(self.clock[0]))
                os.kill(os.getpid(), signal.SIGKILL)
            return real(c, fid)

        sess.measure = measure
        return sess


def _spec(grid: dict) -> TuneSpec:
    return TuneSpec(slo="p99_itl_ms<=100", ladder=grid["ladder"], max_trials=6, confirm_top=0, patience=None)


def _killed_then_resumed(tmp_path: Path, kill_at: int):
    space, grid = _itl_landscape()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    clock_file = tmp_path / "clock"

    def child() -> None:
        ev = _Killing(grid, kill_at, clock_file)
        Tuner(space, ev, _spec(grid), storage=storage).run(clock=lambda: ev.clock[0])

    p = multiprocessing.get_context("fork").Process(target=child)
    p.start()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    ev = _Killing(grid)
    tuner = Tuner(space, ev, _spec(grid), storage=storage)
    res = tuner.run(clock=lambda: ev.clock[0])
    return res, tuner, ev, float(clock_file.read_text())


def _whole_run() -> list:
    space, grid = _itl_landscape()
    ev = ReplayEvaluator(grid)
    res = Tuner(space, ev, _spec(grid)).run(clock=lambda: ev.clock[0])
    return sorted((o for o in res.outcomes if o.launched), key=lambda o: o.trial)


def test_trial_killed_after_a_run_keeps_it_and_measures_again_what_the_kill_cut(tmp_path):
    """Issue 44: a resume used to keep such a trial as it was, so the level the kill cut was never measured and
    ``interrupted_launches`` stayed empty. Now its finished level is kept, the bisection continues on a fresh
    server from the bracket it leaves, and the interrupted start is an interrupted launch (its start's seconds)."""
    whole = _whole_run()
    j = next(i for i, o in enumerate(whole) if len(o.points) >= 2 and i > 0)
    before = sum(len(o.points) for o in whole[:j])
    res, tuner, ev, killed_clock = _killed_then_resumed(tmp_path, before + 2)  # killed as its 2nd run began
    kept = next(o for o in res.outcomes if o.trial == whole[j].trial)
    assert kept.recovered and tuner.recovered_trials == [whole[j].trial]
    assert kept.points[0].concurrency == whole[j].points[0].concurrency  # the run it had finished, kept
    again = [p.concurrency for p in kept.points[1:]]
    assert again and whole[j].points[1].concurrency in again  # the cut level, measured on a fresh server
    assert (kept.concurrency, kept.objective) == (whole[j].concurrency, whole[j].objective)  # as if never killed
    assert "measured again on a fresh server" in kept.reason
    assert ev.opened_keys[0] == key_of(kept.config)  # before anything new
    lost = tuner.lost[str(whole[j].trial)]
    assert lost["relaunched"] and lost["remeasured"] == again and lost["cost_s"] == pytest.approx(50.0)
    launched = [o for o in res.outcomes if o.launched]
    assert res.launches == len(launched) + 1 == 6  # the interrupted start counts against the budget
    # launches, server time and wall time count both processes (replayed clocks: cost == wall time here)
    assert res.cost_s == pytest.approx(killed_clock + ev.clock[0])
    assert res.elapsed_s == pytest.approx(killed_clock + ev.clock[0])
    again_tuner = Tuner(
        *_itl_landscape()[:1],
        ReplayEvaluator(_itl_landscape()[1]),
        _spec(_itl_landscape()[1]),
        storage=f"sqlite:///{tmp_path / 'study.db'}",
    )
    assert again_tuner.cut == [] and again_tuner.launches == 6 and again_tuner.cost_s == pytest.approx(res.cost_s)
    assert again_tuner.outcomes[key_of(kept.config)].points == kept.points  # kept whole across resumes


def test_trial_killed_before_its_first_run_counts_its_launch(tmp_path):
    whole = _whole_run()
    j = 2
    before = sum(len(o.points) for o in whole[:j])
    res, tuner, ev, killed_clock = _killed_then_resumed(tmp_path, before + 1)  # killed as its 1st run began
    assert tuner.recovered_trials == [] and list(tuner.lost) == [str(whole[j].trial)]
    assert tuner.lost[str(whole[j].trial)]["cost_s"] == pytest.approx(50.0)  # its server start (recorded 50 s)
    assert key_of(whole[j].config) in ev.opened_keys  # measured again
    assert res.launches == 6 == sum(1 for o in res.outcomes if o.launched) + 1  # the killed start is one of them
    assert res.cost_s == pytest.approx(killed_clock + ev.clock[0])


def _session(tmp_path, bench: dict | None = None):
    """A tune server session (``bench``: its bench settings, default warm-ups on), whose runs the test replaces
    (``sess._run``)."""
    from types import SimpleNamespace

    from m3ctl.tuning.server import ServerSession

    return ServerSession(
        SimpleNamespace(
            spec=TuneSpec(),
            n_gpus_plan=lambda p: 1,
            registry=SimpleNamespace(root=tmp_path),
            bench={"warmup": True} if bench is None else bench,
        ),
        SimpleNamespace(argv=["vllm", "serve"], gpus=[]),
        SimpleNamespace(url="http://127.0.0.1:1", served_model_name="m", log_path=str(tmp_path / "log"), name="t"),
        tmp_path,
        1.0,
    )


def test_a_repeat_at_a_level_its_server_ran_skips_the_warm_up(tmp_path):
    """A repeat near the SLO boundary runs right after a run at the same load on the same server: its warm-up wave
    (on the H200 about 4 s at c=96, docs/results/h200-study9.md) warms nothing. The first run at each level, and
    the first at a fidelity (a confirmation's longer run), keep theirs; the repeat's record says why it had none."""
    sess = _session(tmp_path)
    sent: list[tuple[int, bool, int]] = []

    def run(cfg, c):
        sent.append((c, cfg.warmup, cfg.num_warmups))
        return {"completed": 8, "validity": {"valid": True, "reasons": []}}

    sess._run = run
    recs = [sess.measure(c, f) for c, f in ((64, 1.0), (96, 1.0), (96, 1.0), (96, 1.0), (96, 2.0))]
    assert sent == [(64, True, 0), (96, True, 0), (96, False, 0), (96, False, 0), (96, True, 0)]
    assert [r["tune"]["warmed_by"] is not None for r in recs] == [False, False, True, True, False]
    assert sorted(p.name for p in tmp_path.glob("bench-*.json")) == [
        "bench-c64-x1.json",
        "bench-c96-x1-r1.json",
        "bench-c96-x1-r2.json",
        "bench-c96-x1.json",
        "bench-c96-x2.json",
    ]


def test_an_interrupted_bench_run_stops_the_study_and_the_trial_is_recovered_on_resume(tmp_path):
    """Seen on the H200 (docs/results/h200-study6.md): a call's timeout sent SIGINT during a bench run; the bench
    returned its partial run (73 of 384 requests, ``interrupted``), and the study recorded the trial complete with
    that level "invalid". ServerSession.measure now keeps the partial run and raises KeyboardInterrupt: the study
    stops with the trial unfinished, and a resume recovers it from its finished levels."""
    sess = _session(tmp_path, bench={})
    sess._run = lambda cfg, c: {"completed": 73, "interrupted": True, "validity": {"valid": False, "reasons": ["x"]}}
    with pytest.raises(KeyboardInterrupt):
        sess.measure(96, 1.0)
    assert (tmp_path / "bench-c96-x1.json").exists()  # the partial run is kept

    space, grid = _itl_landscape()
    whole = _whole_run()
    j = next(i for i, o in enumerate(whole) if len(o.points) >= 2 and i > 0)
    at = sum(len(o.points) for o in whole[:j]) + 2  # the trial's second run is interrupted

    class Interrupted(ReplayEvaluator):
        runs = 0

        def open(self, cand, trial, on_event):
            s = super().open(cand, trial, on_event)
            real = s.measure

            def measure(c: int, fid: float) -> dict:
                Interrupted.runs += 1
                if Interrupted.runs == at:
                    raise KeyboardInterrupt(f"the run at concurrency {c} was interrupted")
                return real(c, fid)

            s.measure = measure
            return s

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    ev = Interrupted(grid)
    with pytest.raises(KeyboardInterrupt):
        Tuner(space, ev, _spec(grid), storage=storage).run(clock=lambda: ev.clock[0])
    tuner = Tuner(space, ReplayEvaluator(grid), _spec(grid), storage=storage)
    assert tuner.recovered_trials == [whole[j].trial]
    kept = next(o for o in tuner.outcomes.values() if o.trial == whole[j].trial)
    assert kept.recovered and [p.concurrency for p in kept.points] == [whole[j].points[0].concurrency]


def test_a_repeat_without_a_warm_up_spreads_its_lanes_over_the_last_runs_latency(tmp_path):
    """The warm-up gives a run's lanes their stagger (BenchConfig.stagger auto: its median latency); a repeat that
    skips it spreads them over the median latency of the run before it at that level, not in lockstep."""
    sess = _session(tmp_path)
    sent: list = []

    def run(cfg, c):
        sent.append((c, cfg.warmup, cfg.stagger))
        return {"completed": 8, "median_e2el_ms": 2200.0 + len(sent), "validity": {"valid": True, "reasons": []}}

    sess._run = run
    for c in (64, 64, 64, 96):
        sess.measure(c, 1.0)
    assert sent == [(64, True, "auto"), (64, False, 2.201), (64, False, 2.202), (96, True, "auto")]
