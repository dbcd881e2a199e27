"""Parallel trials (m3ctl tune --parallel-trials): the GPU-set scheduler (m3ctl/tuning/schedule.py) on fake hosts built
from the catalog's systems (tests/hosts.py), GPU pinning in the planner, and the Tuner running several trials at once
(m3ctl/tuning/parallel.py) against a fake evaluator whose sessions record logical events (open/close with trial, GPU
set, port; no wall clock). Concurrency is made deterministic with threading events and barriers, never sleeps."""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import pytest

from m3ctl.errors import BadInput, ConfigRejected, LaunchFailed
from m3ctl.hw.inventory import Link
from m3ctl.tuning.schedule import (
    Busy,
    Pending,
    Pool,
    Topology,
    first_wave,
    fit_count,
    next_start,
    order_batch,
    parallel_limit,
    pick_gpus,
)
from m3ctl.tuning.search import Tuner, TuneSpec, num_prompts
from m3ctl.tuning.space import Space, key_of
from tests.hosts import synthetic

WAIT = 30.0  # seconds a gate or barrier waits before the test fails (only reached when the feature is broken)


# ---------------------------------------------------------------- topology and GPU sets
def _pairs_host():
    """An 8-GPU host whose GPUs are joined by NVLink in pairs (0-1, 2-3, ...; PCIe otherwise, no NVSwitch), two NUMA
    nodes: the H200 x8 capture's GPUs with other links."""
    inv = synthetic("h200x8")
    gpus = tuple(g.model_copy(update={"fabric_state": None}) for g in inv.gpus)
    links = tuple(
        Link(a=a, b=b, kind="nvlink" if b == a + 1 and a % 2 == 0 else "pcie", detail="NV4")
        for a in range(8)
        for b in range(a + 1, 8)
    )
    return inv.model_copy(update={"gpus": gpus, "links": links})


def test_topology_of_fake_hosts():
    h200 = Topology.of(synthetic("h200x8"))
    assert h200.gpus == tuple(range(8)) and h200.islands == (tuple(range(8)),)  # NVSwitch: one island
    assert [h200.numa[g] for g in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    pairs = Topology.of(_pairs_host())
    assert pairs.islands == ((0, 1), (2, 3), (4, 5), (6, 7))
    pcie = Topology.of(synthetic("rtxpro6000x2"))
    assert pcie.islands == ((0,), (1,))
    visible = Topology.of(synthetic("h200x8").model_copy(update={"visible_devices": {"CUDA_VISIBLE_DEVICES": "4,5,6"}}))
    assert visible.gpus == (4, 5, 6)
    assert Topology.of(synthetic("h200x8").model_copy(update={"gpus": ()})).gpus == ()


def test_pick_gpus_prefers_one_numa_node_and_best_fit():
    t = Topology.of(synthetic("h200x8"))
    assert pick_gpus(t, 4) == (0, 1, 2, 3)
    assert pick_gpus(t, 4, {0}) == (4, 5, 6, 7)  # one NUMA node rather than 1-4
    assert pick_gpus(t, 4, {0, 4}) in ((1, 2, 3, 5), (1, 2, 3, 7), (1, 5, 6, 7))  # spans two nodes: no node fits
    assert len({t.numa[g] for g in pick_gpus(t, 4, {0, 4})}) == 2
    assert pick_gpus(t, 1, {0, 1}) == (2,)  # best fit: the fuller node, node 1 stays whole for a TP=4 trial
    assert pick_gpus(t, 8, {3}) is None and pick_gpus(t, 8) == tuple(range(8))
    assert pick_gpus(t, 5, {0, 1, 2, 3}) is None


def test_pick_gpus_keeps_tp_on_one_nvlink_island():
    t = Topology.of(_pairs_host())
    assert pick_gpus(t, 2, {0}) == (2, 3)  # not 1,2 (PCIe between them)
    assert pick_gpus(t, 2, {0, 2, 4, 6}) is None  # the served TP=2 set (0,1) is an NVLink pair: wait for a pair
    # 4 GPUs span islands whichever set serve gets (0-3 is two pairs): two whole pairs
    assert pick_gpus(t, 4, {0, 1}) == (2, 3, 4, 5)
    assert fit_count(t, 2) == 4 and fit_count(t, 4) == 2 and fit_count(t, 3) == 2


def test_parallel_limit_auto_capped_and_cpu():
    t = Topology.of(synthetic("h200x8"))
    assert parallel_limit(t, 2, "auto")[0] == 4 and "4 trial(s) of 2 GPU(s) fit on 8" in parallel_limit(t, 2)[1]
    assert parallel_limit(t, 8, "auto") == (1, "auto: 1 trial(s) of 8 GPU(s) fit on 8 GPU(s)")
    assert parallel_limit(t, 1, 3)[0] == 3
    n, why = parallel_limit(t, 4, 6)
    assert n == 2 and "capped" in why
    assert parallel_limit(Topology((), ()), 1, 4)[0] == 1
    for bad in (0, -1, "many", True):
        with pytest.raises(ValueError, match="auto"):
            parallel_limit(t, 1, bad)


def test_order_batch_groups_compile_keys_over_lanes():
    items = ["a1", "b1", "a2", "c1", "b2", "a3"]
    key = lambda s: s[0]
    assert order_batch(items, key, 1) == ["a1", "a2", "a3", "b1", "b2", "c1"]
    # lane 0 gets the a's (3), lane 1 the b's then the c (2 + 1): round-robin start order
    assert order_batch(items, key, 2) == ["a1", "b1", "a2", "b2", "a3", "c1"]
    assert order_batch(items, key, 3) == ["a1", "b1", "c1", "a2", "b2", "a3"]
    assert order_batch(["x", "y"], lambda s: None, 2) == ["x", "y"]  # no key: nothing to group


def test_next_start_reuses_the_warm_set_then_spreads_keys():
    t = Topology.of(synthetic("h200x8"))
    ports = (8000, 8001)
    a, b = Pending(2, "A"), Pending(2, "B")
    # idle host: the first candidate, on the first set
    assert next_start([a, b], t, [], ports) == (0, (0, 1), 8000)
    # A runs on 0,1: B starts beside it before a second A (A's graph compiles once, on one lane)
    assert next_start([a, b], t, [Busy((0, 1), 8000, "A")], ports) == (1, (2, 3), 8001)
    # only A's left: it starts anyway (idle GPUs cost more than a cold compile)
    assert next_start([a], t, [Busy((0, 1), 8000, "A")], ports) == (0, (2, 3), 8001)
    # a freed set goes to a candidate of the key it last ran, though another is first in line
    assert next_start([b, a], t, [Busy((2, 3), 8001, "B")], ports, warm={(0, 1): "A"}) == (1, (0, 1), 8000)
    assert next_start([a], t, [Busy((0, 1), 8000, "A"), Busy((2, 3), 8001, "B")], ports) is None  # no port
    big = Pending(8, "C")
    assert next_start([big], t, [Busy((0, 1), 8000, "A")], ports) is None  # waits for the whole machine
    wave = first_wave(
        [Pending(2, "A"), Pending(2, "A"), Pending(2, "B"), Pending(2, "B"), Pending(2, "C")], t, (1, 2, 3, 4)
    )
    assert [(i, g) for i, g, _ in wave] == [(0, (0, 1)), (2, (2, 3)), (4, (4, 5)), (1, (6, 7))]


# ---------------------------------------------------------------- GPU pinning in the planner
def _scale_model(tmp_path):
    from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model

    return build_scale_model(tmp_path / "sm2", ScaleModelSpec(arch="minimax-m2", layers=16, quant="fp8"))


def test_plan_pins_gpus_and_sets_visible_devices(tmp_path):
    from m3ctl.planning.plan import PlanRequest, plan

    model = str(_scale_model(tmp_path))
    inv = synthetic("h200x8")
    p = plan(inv, PlanRequest(model=model, tp=2, dp=1, gpus=[4, 5], runtime="process"))
    assert p.gpus == [4, 5] and p.env["CUDA_VISIBLE_DEVICES"] == "4,5" and p.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert plan(inv, PlanRequest(model=model, tp=2, dp=1, runtime="process")).gpus == [0, 1]  # unpinned: the first
    d = plan(inv, PlanRequest(model=model, tp=2, dp=1, gpus=[4, 5], runtime="docker", image="vllm/vllm-openai:test"))
    assert d.gpu_devices == [g.uuid or str(g.index) for g in inv.gpus[4:6]] and "CUDA_VISIBLE_DEVICES" not in d.env
    amd = synthetic("mi300xx8").model_copy(update={"visible_devices": {"HIP_VISIBLE_DEVICES": "0,1,2,3"}})
    a = plan(amd, PlanRequest(model=model, tp=2, dp=1, gpus=[2, 3], runtime="process"))
    assert a.gpus == [2, 3] and a.env["ROCR_VISIBLE_DEVICES"] == "2,3" and "HIP_VISIBLE_DEVICES" in a.unset_env
    with pytest.raises(BadInput, match="GPU 9 is not a visible GPU"):
        plan(inv, PlanRequest(model=model, tp=2, gpus=[2, 9]))
    with pytest.raises(BadInput, match="named twice"):
        plan(inv, PlanRequest(model=model, tp=2, gpus=[2, 2]))
    with pytest.raises(ConfigRejected, match="parallel.gpus"):
        plan(inv, PlanRequest(model=model, tp=4, dp=1, gpus=[2, 3]))


def test_slot_evaluator_plans_its_gpus_and_port_and_compile_key(tmp_path):
    from m3ctl.tuning.server import ServerEvaluator

    ev = ServerEvaluator(
        synthetic("h200x8"),
        str(_scale_model(tmp_path)),
        tmp_path / "study",
        TuneSpec(),
        plan_base={"runtime": "process", "extra_args": ["--load-format", "dummy"]},
        bench={},
        port=8040,
        name_prefix="t",
    )
    cand = {"tp": 2, "dp": 1, "max_num_seqs": 64}
    slot = ev.for_slot((6, 7), 8043)
    p = slot.trial_plan(cand, 3)
    assert p.gpus == [6, 7] and p.port == 8043 and p.env["CUDA_VISIBLE_DEVICES"] == "6,7" and p.name == "t-t3"
    assert ev.plan(cand).gpus == [0, 1] and ev.port == 8040  # the study's evaluator is unchanged
    assert ev.gpus_needed(cand) == 2 and ev.gpus_needed({**cand, "dp": 2}) == 4
    key = ev.compile_key(cand)
    assert slot.compile_key(cand) == key  # GPUs and port are not in vLLM's compile hash
    # the study's capture bound (fast starts: the ladder's top, 64 here) pins the graph sizes, so max-num-seqs no
    # longer reaches the compile hash (H200: a --max-num-seqs change loaded the same compiled model); without it,
    # max-num-seqs sets vLLM's default capture sizes and is part of the key
    assert ev.compile_key({**cand, "max_num_seqs": 128}) == key
    plain = ServerEvaluator(
        synthetic("h200x8"),
        ev.model,
        tmp_path / "s3",
        TuneSpec(),
        plan_base={"runtime": "process", "extra_args": ["--load-format", "dummy"]},
        bench={},
        port=8040,
        name_prefix="t",
        fast_starts=False,
    )
    assert plain.compile_key({**cand, "max_num_seqs": 128}) != plain.compile_key(cand)
    assert ev.compile_key({**cand, "tp": 4}) != key
    pinned = ServerEvaluator(
        synthetic("h200x8"),
        ev.model,
        tmp_path / "s2",
        TuneSpec(),
        plan_base={
            "runtime": "process",
            "overrides": {"compilation-config": '{"cudagraph_capture_sizes": [1, 2, 4, 8]}'},
        },
        bench={},
        port=8040,
        name_prefix="t",
    )
    assert pinned.compile_key(cand) == pinned.compile_key({**cand, "max_num_seqs": 128})
    assert pinned.compile_key(cand) != pinned.compile_key({**cand, "max_num_batched_tokens": 2048})


def test_running_json_lists_every_running_trial_and_stays_compatible(tmp_path, monkeypatch):
    from m3ctl.core.state import Registry
    from m3ctl.tuning.server import ServerEvaluator, stop_leftovers

    reg = Registry(tmp_path / "state")
    ev = ServerEvaluator(
        synthetic("h200x8"),
        "m",
        tmp_path,
        TuneSpec(),
        plan_base={},
        bench={},
        port=8000,
        name_prefix="tune-x",
        registry=reg,
    )
    a, b = ev.for_slot((0, 1), 8000), ev.for_slot((2, 3), 8001)
    run = tmp_path / "running.json"
    a._mark_running("tune-x-t1", 1)
    one = {"name": "tune-x-t1", "trial": 1, "state_dir": str(reg.root)}
    assert run.read_text() == json.dumps(one, indent=2)  # the single-record file, byte for byte
    b._mark_running("tune-x-t2", 2)
    data = json.loads(run.read_text())
    assert data["name"] == "tune-x-t1" and [r["name"] for r in data["running"]] == ["tune-x-t1", "tune-x-t2"]
    stopped: list[str] = []
    monkeypatch.setattr(reg, "exists", lambda n: n in ("tune-x-t1", "tune-x-t2"))
    monkeypatch.setattr(reg, "list", list)
    monkeypatch.setattr("m3ctl.serving.serve.stop", lambda names, registry: stopped.extend(names))
    assert stop_leftovers(tmp_path, "tune-y", reg) == ["tune-x-t1", "tune-x-t2"] and not run.exists()
    a._mark_stopped("tune-x-t1")
    assert json.loads(run.read_text()) == {"name": "tune-x-t2", "trial": 2, "state_dir": str(reg.root)}
    b._mark_stopped("tune-x-t2")
    assert not run.exists()


def test_parallel_bench_runs_each_in_its_own_process(tiny_models, tmp_path):
    """The bench runner allows one run per process (its stall tracker is process-wide): while this process holds
    the run lock, a plain trial session cannot measure, a slot evaluator's session can (each run in a child
    process); two of them measure at once against the ground-truth server and both runs complete."""
    from m3ctl.loadgen import runner
    from tests.conftest import groundtruth_session, start_groundtruth

    proc, url = start_groundtruth()
    try:
        sessions = []
        for i in range(2):
            (tmp_path / f"t{i}").mkdir()
            sessions.append(groundtruth_session(url, tmp_path / f"t{i}", tokenizer=str(tiny_models["m2"]))[0])
        assert runner._RUN_LOCK.acquire(blocking=False)
        try:
            with pytest.raises((BadInput, LaunchFailed)):
                sessions[0].measure(2, 1.0)  # in this process: refused while another run holds the lock
            for s in sessions:
                s.ev.isolate_bench = True
            out: dict[int, dict] = {}
            threads = [
                threading.Thread(target=lambda i=i, s=s: out.__setitem__(i, s.measure(2, 1.0)))
                for i, s in enumerate(sessions)
            ]
            for th in threads:
                th.start()
            for th in threads:
                th.join(WAIT)
        finally:
            runner._RUN_LOCK.release()
        n = num_prompts(sessions[0].ev.spec, 2, 1.0)
        assert sorted(out) == [0, 1] and all(r["completed"] == n and r["failed"] == 0 for r in out.values())
        assert all((s.dir / "bench-c2-x1.json").exists() for s in sessions)
    finally:
        proc.terminate()
        proc.wait(10)


# ---------------------------------------------------------------- the Tuner with trials at once
class Recorder:
    """Logical events of the fake sessions, in the order they happened: ("open", trial, gpus, port, ckey),
    ("close", trial, gpus), ("abort", trial)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.events: list[tuple] = []

    def add(self, *e) -> None:
        with self.cond:
            self.events.append(e)
            self.cond.notify_all()

    def wait_for(self, pred, what: str) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self.events), WAIT), f"timed out waiting for {what}: {self.events}"

    def opens(self) -> list[tuple]:
        return [e for e in self.events if e[0] == "open"]


def replay(events: list[tuple]) -> int:
    """Check that concurrent trials never share a GPU or a port and that every session was closed; returns the
    largest number of sessions open at once."""
    active: dict[int, tuple] = {}
    most = 0
    for e in events:
        if e[0] == "open":
            _, n, gpus, port, _ = e
            for m, (g, p) in active.items():
                assert not set(g) & set(gpus), f"trials {m} and {n} share GPUs {set(g) & set(gpus)}"
                assert p != port, f"trials {m} and {n} share port {port}"
            active[n] = (gpus, port)
            most = max(most, len(active))
        elif e[0] == "close":
            del active[e[1]]
    assert not active, f"sessions never closed: {active}"
    return most


def result(cand: dict, c: int) -> dict:
    """A bench result of the fake server: capacity grows with max_num_seqs and speculation; p90 TPOT 10 ms per
    request in flight over the capacity (SLO p90_tpot_ms<=50 holds up to 5 x capacity)."""
    cap = cand.get("max_num_seqs", 32) / 32 + cand.get("spec_depth", 0)
    tput = 100.0 * min(c, 5 * cap) * (1 + cand.get("max_num_batched_tokens", 0) / 1e5)
    return {
        "completed": 8,
        "failed": 0,
        "duration": 1.0,
        "total_token_throughput": tput,
        "output_throughput": tput / 2,
        "p90_tpot_ms": 10.0 * c / cap,
        "validity": {"valid": True, "reasons": []},
    }


class FakeSession:
    def __init__(self, ev: FakeEvaluator, cand: dict, trial: int):
        self.ev, self.cand, self.trial, self.start_s = ev, cand, trial, 1.0
        self.closed = threading.Event()
        self.first = True
        ev.hooks.cands[trial] = cand
        ev.rec.add("open", trial, ev.gpus, ev.port, ev.compile_key(cand))

    def measure(self, c: int, fidelity: float) -> dict:
        self.runs = getattr(self, "runs", 0) + 1
        if self.first:
            self.first = False
            self.ev.hooks.first_run(self)
        if self.ev.hooks.hold == (key_of(self.cand), self.runs):  # this run never ends: the server is stopped
            assert self.closed.wait(WAIT), f"trial {self.trial} was never stopped"
        if self.closed.is_set():
            raise LaunchFailed("server stopped", "fake")
        if key_of(self.cand) in self.ev.hooks.crash_run:
            raise LaunchFailed("engine died during the run (fake)", "fake", phase="serving")
        return result(self.cand, c)

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.ev.hooks.gate(self.cand).set()  # a run waiting at its gate ends with the server
            self.ev.rec.add("close", self.trial, self.ev.gpus)


class Hooks:
    """What the fake sessions do at chosen moments (shared by the study evaluator and its slot copies)."""

    def __init__(self):
        self.barrier: threading.Barrier | None = None  # the first run of the first N sessions waits on it
        self.gates: dict[str, threading.Event] = {}  # config key -> its first run waits until set
        self.gated = False
        self.crash_open: set[str] = set()
        self.crash_run: set[str] = set()
        self.slow_open: set[str] = set()  # starting blocks until the slot is aborted
        self.hold: tuple[str, int] | None = None  # (config key, n): its n-th bench run lasts until it is stopped
        self.n_barrier = 0
        self.starting: set[str] = set()  # slow starts in progress
        self.cands: dict[int, dict] = {}  # trial -> its configuration, once opened
        self.lock = threading.Lock()

    def gate(self, cand: dict) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(key_of(cand), threading.Event())

    def first_run(self, s: FakeSession) -> None:
        if self.barrier is not None:
            with self.lock:
                self.n_barrier += 1
                mine = self.n_barrier <= self.barrier.parties
            if mine:
                self.barrier.wait()
        if self.gated:
            assert self.gate(s.cand).wait(WAIT), f"gate of trial {s.trial} never opened"


class FakeEvaluator:
    """Evaluator protocol plus for_slot/gpus_needed/compile_key/abort; ``gpus``/``port`` are set on slot copies."""

    def __init__(self, rec: Recorder, hooks: Hooks, ckey=None):
        self.rec, self.hooks, self.ckey = rec, hooks, ckey
        self.gpus: tuple[int, ...] | None = None
        self.port: int | None = None
        self.aborted = threading.Event()

    def for_slot(self, gpus, port):
        c = copy.copy(self)
        c.gpus, c.port, c.aborted = tuple(gpus), port, threading.Event()
        return c

    def check(self, cand):
        return None

    def gpus_needed(self, cand) -> int:
        return cand["tp"] * cand.get("dp", 1)

    def n_gpus(self, cand) -> int:
        return self.gpus_needed(cand)

    def compile_key(self, cand):
        return self.ckey(cand) if self.ckey is not None else key_of(cand)

    def command(self, cand) -> str:
        return json.dumps(cand)

    def open(self, cand, trial, on_event):
        assert self.gpus is not None and len(self.gpus) == self.gpus_needed(cand), "opened without its own GPUs"
        k = key_of(cand)
        if k in self.hooks.slow_open:
            self.hooks.starting.add(k)
            on_event("fake: starting")
            assert self.aborted.wait(WAIT), "a starting trial was never stopped"
            raise LaunchFailed("server stopped while starting (fake)", "fake")
        if k in self.hooks.crash_open:
            raise LaunchFailed("CUDA out of memory at start (fake)", "fake", phase="load")
        return FakeSession(self, cand, trial)

    def abort(self) -> bool:
        if not self.aborted.is_set():
            self.aborted.set()
            self.rec.add("abort", self.gpus)
        return True


def _pool(inv=None, n: int = 4) -> Pool:
    return Pool(
        topo=Topology.of(inv or synthetic("h200x8")), ports=tuple(8000 + i for i in range(n)), limit=n, why="test"
    )


def _spec(**kw) -> TuneSpec:
    return TuneSpec(
        **{"slo": "p90_tpot_ms<=50", "ladder": [1, 2, 4, 8], "max_trials": 8, "confirm_top": 0, "patience": None, **kw}
    )


def _tp2_space() -> Space:
    return Space(
        values={
            "tp": [2],
            "dp": [1],
            "spec_depth": [0, 1],
            "max_num_seqs": [32, 64],
            "max_num_batched_tokens": [4096, 8192],
        }
    )


def _in_thread(fn):
    """Run ``fn`` in a thread; returns (thread, box) where box holds its result or exception."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001
            box["error"] = e

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th, box


class Driver:
    """Runs a gated study (every trial's first bench run waits at its gate) in a thread and opens one gate at a time,
    each time the scheduler has started everything it can: every started, unfinished trial waits at its gate and the
    study's thread has handled its first "bench" event (so it has gone back to waiting on its trials). Which trial
    runs beside which is then decided by the scheduler alone, not by thread timing."""

    def __init__(self, hooks: Hooks):
        self.hooks = hooks
        self.cond = threading.Condition()
        self.started: set[int] = set()
        self.ready: set[int] = set()
        self.done: set[int] = set()
        self.finished = False

    def on_event(self, n, desc, msg) -> None:
        with self.cond:
            if msg.startswith("GPUs "):
                self.started.add(n)
            elif msg.startswith("bench c="):
                self.ready.add(n)
            elif msg.startswith("done:"):
                self.done.add(n)
            self.cond.notify_all()

    def run(self, tuner):
        box: dict = {}

        def target() -> None:
            try:
                box["result"] = tuner.run()
            except BaseException as e:  # noqa: BLE001
                box["error"] = e
            with self.cond:
                self.finished = True
                self.cond.notify_all()

        th = threading.Thread(target=target, daemon=True)
        th.start()
        released: set[int] = set()
        try:
            while True:

                def settled() -> bool:
                    waiting = self.started - self.done - released
                    return self.finished or bool(waiting) and waiting <= self.ready

                with self.cond:
                    assert self.cond.wait_for(settled, WAIT), f"the study never settled: {self.started, self.ready}"
                    if self.finished:
                        break
                    n = min(self.started - self.done - released)
                released.add(n)
                self.hooks.gate(self.hooks.cands[n]).set()
        finally:
            for g in list(self.hooks.gates.values()):
                g.set()
            th.join(WAIT)
        if "error" in box:
            raise box["error"]
        return box["result"]


def test_four_tp2_trials_run_as_one_wave_on_eight_gpus():
    """TP=2 on an 8-GPU H200 host: the first configuration and its three poll neighbours start as one wave on
    disjoint GPU pairs and ports (their first bench runs meet at a barrier of four: fewer at once would break it)."""
    rec, hooks = Recorder(), Hooks()
    hooks.barrier = threading.Barrier(4, timeout=WAIT)
    ev = FakeEvaluator(rec, hooks)
    space = _tp2_space()
    res = Tuner(space, ev, _spec(max_trials=8), pool=_pool()).run()
    assert replay(rec.events) == 4
    wave = rec.opens()[:4]
    assert sorted(g for e in wave for g in e[2]) == list(range(8)) and {e[3] for e in wave} == {8000, 8001, 8002, 8003}
    assert res.launches == 8 == len(rec.opens()) and res.stopped_by.startswith("trial budget")
    assert all(o.status == "feasible" for o in res.outcomes)
    assert len({key_of(o.config) for o in res.outcomes}) == 8 == space.size()  # every configuration once


def test_a_tp8_trial_waits_for_the_whole_machine():
    """TP 4 and 8 on 8 GPUs: a TP=8 trial opens only when no other trial runs, and nothing opens beside it."""
    rec, hooks = Recorder(), Hooks()
    hooks.gated = True
    drive = Driver(hooks)
    ev = FakeEvaluator(rec, hooks)
    space = Space(values={"tp": [2, 4, 8], "dp": [1], "spec_depth": [0, 1], "max_num_seqs": [32, 64]})
    res = drive.run(Tuner(space, ev, _spec(max_trials=10), on_event=drive.on_event, pool=_pool()))
    assert replay(rec.events) >= 2  # smaller trials ran side by side
    active: set[int] = set()
    waited = False
    tp = {o.trial: o.config["tp"] for o in res.outcomes}
    prev = None
    for e in rec.events:
        if e[0] == "open":
            if tp[e[1]] == 8:
                assert not active, f"TP=8 trial {e[1]} opened beside {active}"
                waited |= prev is not None and prev[0] == "close" and tp[prev[1]] != 8
            else:
                assert not any(tp[m] == 8 for m in active), f"trial {e[1]} opened beside a TP=8 trial"
            active.add(e[1])
        elif e[0] == "close":
            active.discard(e[1])
        prev = e
    assert waited, "no TP=8 trial had to wait for a smaller one to end"
    assert len(rec.opens()) == res.launches


def test_consecutive_starts_on_a_gpu_set_share_the_compile_key():
    """Two lanes (2 x TP=2); the first configuration (graph A) and its poll (A, B, B): B starts beside A instead of a
    second cold A; when A's set frees, the A neighbour starts there; when B's frees, the second B. Each GPU set
    compiles one graph. The gates open in a chosen order (threading events), so the run is deterministic."""
    rec, hooks = Recorder(), Hooks()
    hooks.gated = True
    space = Space(
        values={
            "tp": [2],
            "dp": [1],
            "spec_depth": [0, 1],
            "max_num_seqs": [32, 64],
            "max_num_batched_tokens": [4096, 8192],
        }
    )
    anchor = space.anchor()
    ckey = lambda c: "A" if c == anchor or c["spec_depth"] == 1 else "B"
    ev = FakeEvaluator(rec, hooks, ckey)
    tuner = Tuner(space, ev, _spec(max_trials=4), pool=_pool(n=2))
    th, box = _in_thread(tuner.run)
    try:
        rec.wait_for(lambda ev_: len([e for e in ev_ if e[0] == "open"]) >= 2, "two trials to open")
        (_, _, g0, _, k0), (_, _, g1, _, k1) = rec.opens()[:2]
        assert (k0, k1) == ("A", "B") and g0 == (0, 1) and g1 == (2, 3)
        assert len(rec.opens()) == 2  # two lanes
        hooks.gate(anchor).set()
        rec.wait_for(lambda ev_: len([e for e in ev_ if e[0] == "open"]) >= 3, "the third trial")
        assert rec.opens()[2][2] == (0, 1) and rec.opens()[2][4] == "A"  # the A neighbour, on A's set
        hooks.gate(hooks.cands[rec.opens()[1][1]]).set()  # the running B ends
        rec.wait_for(lambda ev_: len([e for e in ev_ if e[0] == "open"]) >= 4, "the fourth trial")
        assert rec.opens()[3][2] == (2, 3) and rec.opens()[3][4] == "B"
    finally:
        for cand in space.grid():
            hooks.gate(cand).set()
        th.join(WAIT)
    assert "error" not in box, box.get("error")
    assert replay(rec.events) == 2
    per_set: dict[tuple, set] = {}
    for e in rec.opens():
        per_set.setdefault(e[2], set()).add(e[4])
    assert per_set == {(0, 1): {"A"}, (2, 3): {"B"}}
    assert box["result"].launches == 4


def test_a_crash_in_one_parallel_trial_is_recorded_and_the_others_continue():
    rec, hooks = Recorder(), Hooks()
    space = _tp2_space()
    anchor = space.anchor()
    poll = [c for c in space.grid() if sum(c[k] != anchor[k] for k in c) == 1]
    hooks.crash_open.add(key_of(poll[0]))
    hooks.crash_run.add(key_of(poll[1]))
    hooks.gated = True
    drive = Driver(hooks)
    ev = FakeEvaluator(rec, hooks)
    res = drive.run(Tuner(space, ev, _spec(max_trials=8), on_event=drive.on_event, pool=_pool()))
    by = {key_of(o.config): o for o in res.outcomes}
    assert by[key_of(poll[0])].status == "crashed" and "out of memory at start" in by[key_of(poll[0])].reason
    assert by[key_of(poll[1])].status == "crashed" and "engine died during the run" in by[key_of(poll[1])].reason
    assert by[key_of(poll[1])].launched and by[key_of(poll[0])].launched
    feasible = [o for o in res.outcomes if o.status == "feasible"]
    assert len(feasible) == 6 and res.best is not None and res.launches == 8
    # the start crash happened while the first configuration and the run-crash neighbour were open beside it
    assert replay(rec.events) >= 3


def test_ctrl_c_stops_every_running_session_and_a_starting_one(tmp_path):
    """Ctrl-C (KeyboardInterrupt in the main thread) while three trials measure and a fourth is starting: every
    session is closed, the starting server is stopped (abort), the four optuna trials are FAIL, and it propagates."""
    rec, hooks = Recorder(), Hooks()
    hooks.gated = True  # the three measuring trials wait at their first run
    space = _tp2_space()
    anchor = space.anchor()
    last = [c for c in space.grid() if sum(c[k] != anchor[k] for k in c) == 1][-1]
    hooks.slow_open.add(key_of(last))

    def on_event(n, desc, msg) -> None:
        if len(rec.opens()) == 3 and hooks.starting:
            raise KeyboardInterrupt

    tuner = Tuner(
        space,
        FakeEvaluator(rec, hooks),
        _spec(),
        storage=f"sqlite:///{tmp_path / 'study.db'}",
        on_event=on_event,
        pool=_pool(),
    )
    with pytest.raises(KeyboardInterrupt):
        tuner.run()
    assert len(rec.opens()) == 3 and replay(rec.events) == 3  # every opened session closed
    starting = set(range(8)) - {g for e in rec.opens() for g in e[2]}
    assert {g for e in rec.events if e[0] == "abort" for g in e[1]} >= starting  # the starting server stopped
    states = [t.state.name for t in tuner.study.get_trials(deepcopy=False)]
    assert states.count("FAIL") == 4 and "RUNNING" not in states and "COMPLETE" not in states


def test_resume_after_ctrl_c_keeps_finished_runs_and_counts_every_start(tmp_path):
    """Ctrl-C after the first trial saved two bench runs while three others waited at their first: the resume keeps
    those two runs (its search goes on from them on a fresh server), counts the three starts that saved nothing and
    the first trial's interrupted one, and ends at the budget.
    """
    space = _tp2_space()
    anchor = space.anchor()
    rec, hooks = Recorder(), Hooks()
    hooks.gated = True
    hooks.gate(anchor).set()  # the first trial measures freely; its poll neighbours wait
    hooks.hold = (key_of(anchor), 3)  # ... and its third run is still going at Ctrl-C
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    runs = []

    def on_event(n, desc, msg) -> None:
        if n == 0 and msg.startswith("c="):
            runs.append(msg)
        if len(runs) == 2 and len(rec.opens()) == 4:
            raise KeyboardInterrupt

    tuner = Tuner(space, FakeEvaluator(rec, hooks), _spec(), storage=storage, on_event=on_event, pool=_pool())
    with pytest.raises(KeyboardInterrupt):
        tuner.run()
    assert replay(rec.events) == 4  # every session closed
    again = Tuner(space, FakeEvaluator(Recorder(), Hooks()), _spec(), storage=storage, pool=_pool())
    assert again.recovered_trials == [0] and sorted(again.interrupted_trials) == [0, 1, 2, 3]
    kept = again.outcomes[key_of(anchor)]
    assert kept.recovered and len(kept.points) == 2 and kept.status == "feasible"
    assert sorted(again.lost) == ["1", "2", "3"]  # started, no run finished: their starts count
    res = again.run()
    # issue 44: the first trial's search, cut at its third run, goes on on a fresh server: its interrupted start
    # counts too (an interrupted launch)
    assert again.lost["0"]["relaunched"] and again.lost["0"]["kept"] == [p.concurrency for p in kept.points[:2]]
    assert res.launches == 8 and len([o for o in res.outcomes if o.launched]) == 8 - 4


def test_serial_when_one_trial_fits_or_no_slot_support():
    """A pool of one, or an evaluator without for_slot (a replay), is the serial search, unchanged."""
    from m3ctl.tuning.replay import ReplayEvaluator
    from tests.tuning.test_tune import _grid

    assert Tuner(_tp2_space(), FakeEvaluator(Recorder(), Hooks()), _spec(), pool=_pool(n=1)).pool is None
    grid = _grid()
    from m3ctl.tuning.replay import recorded_space

    spec = TuneSpec(slo=grid["meta"]["slo"], ladder=grid["ladder"], max_trials=4, seed=1, confirm_top=1)
    a, b = ReplayEvaluator(grid), ReplayEvaluator(grid)
    ra = Tuner(recorded_space(grid), a, spec).run(clock=lambda: a.clock[0])
    t = Tuner(recorded_space(grid), b, spec, pool=_pool())
    assert t.pool is None
    rb = t.run(clock=lambda: b.clock[0])
    assert [(o.trial, o.config, o.objective) for o in ra.outcomes] == [
        (o.trial, o.config, o.objective) for o in rb.outcomes
    ]


# ---------------------------------------------------------------- dry run and CLI
#: A small space on the H200 x8 (TP 2, 2 x 2 x 2 configurations): a dry run plans every one of them.
PINS = [
    "tp=2",
    "dp=1",
    "dcp=1",
    "ep=off",
    "dbo=off",
    "kv_cache_dtype=default",
    "spec_depth=0,1",
    "max_num_batched_tokens=2048,8192",
]


def test_dry_run_shows_slots_and_start_order(tmp_path):
    from m3ctl.tuning import study as st

    inv = synthetic("h200x8")
    model = str(_scale_model(tmp_path))
    settings = st.new_settings(model, inv, slo="p90_tpot_ms<=50", knobs=PINS, max_trials=6, port=18500)
    settings["plan_base"].update(runtime="process", extra_args=["--load-format", "dummy"])
    r = st.dry_run(tmp_path / "s", settings, inventory=inv, parallel_trials="auto")
    par = r["parallel"]
    assert par["trials"] == 4 and par["ports"][0] == 18500 and len(set(par["ports"])) == 4
    assert [s["gpus"] for s in par["slots"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    wave = par["first_wave"]
    assert wave[0]["config"] == r["first"]["config"] and wave[0]["gpus"] == [0, 1]
    assert len(wave) == min(4, len(wave) + len(par["queued"]))
    assert sorted(g for w in wave for g in w["gpus"]) == list(range(2 * len(wave)))
    assert any("up to 4 at a time" in s for s in r["order"])
    serial = st.dry_run(tmp_path / "s", settings, inventory=inv, parallel_trials=1)["parallel"]
    assert serial["trials"] == 1 and len(serial["first_wave"]) == 1
    with pytest.raises(BadInput, match="parallel-trials"):
        st.dry_run(tmp_path / "s", settings, inventory=inv, parallel_trials=0)


@pytest.mark.parametrize(("system", "trials"), [("b200x8", 4), ("h200x8", 2)])
def test_dry_run_slots_are_the_sets_the_limit_counted(tmp_path, system, trials):
    """The dry run's slots have the GPUs of the space's smallest configuration as planned (TP x PP x DP, what the
    scheduler sizes trials by), one per trial at once (before: min(tp) x min(dp) GPUs, "4 trial(s) of 2 GPU(s)"
    shown as slots GPUs 0; GPUs 1; GPUs 2; GPUs 3 on a B200 x8)."""
    from m3ctl.hw.systems import inventory_for_system
    from m3ctl.tuning import study as st

    inv = inventory_for_system(system)
    settings = st.new_settings("MiniMax-M3.1-Flash", inv, slo="p90_tpot_ms<=50", port=18600)
    par = st.dry_run(tmp_path / "s", settings, inventory=inv, parallel_trials="auto")["parallel"]
    need = 8 // trials
    assert par["trials"] == trials == len(par["slots"]) and f"{trials} trial(s) of {need} GPU(s)" in par["why"]
    assert [s["gpus"] for s in par["slots"]] == [list(range(i * need, (i + 1) * need)) for i in range(trials)]


def test_cli_parallel_trials_option(tmp_path):
    from tests.conftest import run_cli

    model = _scale_model(tmp_path)
    args = [
        "tune",
        "--model",
        str(model),
        "--system",
        "h200x8",
        "--study-dir",
        str(tmp_path / "s"),
        "--dry-run",
        *(a for k in PINS for a in ("--knob", k)),
        "--port",
        "18600",
    ]
    p = run_cli(*args, "--parallel-trials", "2", "--json", "--", "--load-format", "dummy")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["parallel"]["trials"] == 2
    t = run_cli(*args, "--", "--load-format", "dummy")
    assert t.returncode == 0, t.stderr
    assert "trials: up to 4 at once" in t.stdout and "starts on GPUs 0,1 port 18600" in t.stdout
    bad = run_cli(*args, "--parallel-trials", "zero")
    assert bad.returncode == 2 and "auto or a whole number" in bad.stderr
    assert Path(tmp_path / "s").exists() is False


def test_real_evaluator_runs_trials_side_by_side_on_fake_vllm_servers(tmp_path, monkeypatch):
    """The real path (ServerEvaluator, launch_and_wait, the quick smoke, bench runs in child processes) on the fake
    8-GPU H200 host with tests/fake_vllm.py as the server: two trials run at once, each with its own GPUs in
    CUDA_VISIBLE_DEVICES, its own port, its own folder with its bench JSONs; nothing is left running."""
    from m3ctl.core.state import Registry
    from m3ctl.tuning import study as st
    from tests.conftest import FAKE_VLLM, free_port

    monkeypatch.setenv("FAKE_VLLM", json.dumps({"serve": {}}))
    exe = tmp_path / "vllm"
    exe.write_text(f'#!/bin/sh\nexec {__import__("sys").executable} {FAKE_VLLM} "$@"\n')
    exe.chmod(0o755)
    inv = synthetic("h200x8")
    settings = st.new_settings(
        str(_scale_model(tmp_path)),
        inv,
        knobs=PINS,
        ladder=[1, 2],
        max_trials=3,
        port=free_port(),
        input_len=16,
        output_len=8,
        prompts_per_concurrency=2,
        baseline=False,
        confirm_top=0,
        warmup=False,
    )
    settings["plan_base"].update(runtime="process", vllm_executable=str(exe))
    events: list[tuple] = []
    sdir = tmp_path / "study"
    res, _, _ = st.run_tune(
        sdir, settings, inventory=inv, parallel_trials=2, on_event=lambda n, d, m: events.append((n, m))
    )
    # feasible, or unjudged when the busy 2-core host disturbed the runs (contention-invalid: no verdict, not a miss)
    assert res.launches == 3 and all(
        o.status == "feasible" or (o.status == "unjudged" and "host CPU contention" in o.reason) for o in res.outcomes
    ), [(o.status, o.reason) for o in res.outcomes]
    assert any(o.status == "feasible" for o in res.outcomes), [(o.status, o.reason) for o in res.outcomes]
    # trials 0 and 1 side by side: 1 measured before 0 was done
    first_done = events.index(next(e for e in events if e[0] == 0 and e[1].startswith("done:")))
    assert any(e[0] == 1 and e[1].startswith("c=") for e in events[:first_done])
    cmds = {t.name: json.loads((t / "config.json").read_text())["command"] for t in (sdir / "trials").iterdir()}
    assert "CUDA_VISIBLE_DEVICES=0,1 " in cmds["0000"] and "CUDA_VISIBLE_DEVICES=2,3 " in cmds["0001"]
    port0, port1 = (c.split("--port ")[1].split()[0] for c in (cmds["0000"], cmds["0001"]))
    assert port0 != port1
    assert all(
        list((sdir / "trials" / n).glob("bench-c*.json")) and (sdir / "trials" / n / "server.log").exists()
        for n in cmds
    )
    assert not (sdir / "running.json").exists() and Registry().list() == []
