"""A resumed tune measures again what an interruption cut, records it, and quotes figures measured at the level
it names (issue 44 item 4). The search is replayed from a recorded grid (m3ctl/tuning/replay.py); the
interruption is a trial server stopped by ``m3ctl stop --all`` mid-trial (TrialServerStopped, as
m3ctl.tuning.server.ServerSession raises it: tests/tuning/test_tune_stopped_server.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from m3ctl.loadgen.slo import parse_slo
from m3ctl.tuning.measure import Outcome, Point, TrialServerStopped, confirm
from m3ctl.tuning.replay import ReplayEvaluator
from m3ctl.tuning.search import Tuner
from m3ctl.tuning.space import key_of
from tests.tuning.test_tune import _itl_landscape
from tests.tuning.test_tune_resume import _spec, _whole_run


class _StoppedAt(ReplayEvaluator):
    """Replays the grid; bench run number ``at`` finds its server stopped by `m3ctl stop --all`."""

    def __init__(self, grid: dict, at: int | None = None):
        super().__init__(grid)
        self.at, self.runs, self.opened_keys = at, 0, []

    def open(self, cand, trial, on_event):
        sess = super().open(cand, trial, on_event)
        self.opened_keys.append(key_of(cand))
        real = sess.measure

        def measure(c: int, fid: float) -> dict:
            self.runs += 1
            if self.runs == self.at:
                raise TrialServerStopped(
                    f"trial server 's-t{trial}' was stopped during the run at concurrency {c} by `m3ctl stop`", "resume"
                )
            return real(c, fid)

        sess.measure = measure
        return sess


def test_a_resume_measures_again_the_level_a_stop_cut_and_records_the_interrupted_launch(tmp_path):
    space, grid = _itl_landscape()
    whole = _whole_run()
    j = next(i for i, o in enumerate(whole) if len(o.points) >= 3 and i > 0)
    at = sum(len(o.points) for o in whole[:j]) + 2  # its second level is cut
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    ev = _StoppedAt(grid, at)
    with pytest.raises(TrialServerStopped):  # the study stops as on Ctrl-C, the trial unfinished
        Tuner(space, ev, _spec(grid), storage=storage).run(clock=lambda: ev.clock[0])
    ev2 = _StoppedAt(grid)
    tuner = Tuner(space, ev2, _spec(grid), storage=storage)
    assert [o.trial for o in tuner.cut] == [whole[j].trial]
    res = tuner.run(clock=lambda: ev2.clock[0])
    o = next(x for x in res.outcomes if x.trial == whole[j].trial)
    cut = whole[j].points[1].concurrency
    assert ev2.opened_keys[0] == key_of(o.config)  # measured again first, on a fresh server
    assert cut in [p.concurrency for p in o.points[1:]]  # the level the stop cut is measured
    assert sorted({p.concurrency for p in o.points}) == sorted({p.concurrency for p in whole[j].points})
    assert (o.concurrency, o.objective, o.status) == (whole[j].concurrency, whole[j].objective, whole[j].status)
    lost = tuner.lost[str(whole[j].trial)]  # result.json's interrupted_launches
    assert lost["relaunched"] and lost["kept"] == [whole[j].points[0].concurrency] and cut in lost["remeasured"]
    assert res.launches == sum(1 for x in res.outcomes if x.launched) + 1


def test_a_stepped_down_confirmation_quotes_figures_measured_at_its_level():
    """The search held c=96 (80 there, 100 at c=64); the fresh server refuted c=96 and held c=64 (110). Before, the
    outcome read "80 at c=64": the c=96 search figure printed at c=64, and quoted so in the choice's reason."""
    slo = parse_slo("p90_tpot_ms<=30")
    pts = [
        Point(concurrency=64, fidelity=1.0, objective=100.0, slo_ok=True, valid=True, duration_s=1.0, metrics={}),
        Point(concurrency=96, fidelity=1.0, objective=80.0, slo_ok=True, valid=True, duration_s=1.0, metrics={}),
    ]
    out = Outcome({"x": 1}, "feasible", 80.0, 96, list(pts), launched=True, trial=1)
    confirmation = {96: (False, 70.0), 64: (True, 110.0)}

    def level(session, spec, slo_, c, fid, n, on_event):
        ok, obj = confirmation[c]
        return Point(concurrency=c, fidelity=fid, objective=obj, slo_ok=ok, valid=True, duration_s=1.0, metrics={})

    import m3ctl.tuning.measure as m

    ev = SimpleNamespace(open=lambda *a: SimpleNamespace(start_s=1.0, close=lambda: None), n_gpus=lambda c: 1)
    spec = SimpleNamespace(ladder=[32, 64, 96], confirm_factor=2.0)
    real, m.measure_level = m.measure_level, level
    try:
        confirm(ev, out, spec, slo, lambda msg: None)
    finally:
        m.measure_level = real
    assert (out.concurrency, out.confirmed) == (64, 110.0)
    assert out.objective == 100.0 and out.final == 100.0  # both figures at c=64; never the c=96 search's 80
