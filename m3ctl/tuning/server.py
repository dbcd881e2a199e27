"""Real evaluation: plan() -> launch_and_wait() -> run_bench() per concurrency -> stop(), with every trial's
bench JSON and server log saved in the study dir, and the running server recorded so a resume after
SIGKILL stops it first (``running.json`` + the m3ctl registry)."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import m3ctl
from m3ctl.core import signals
from m3ctl.core.secrets import launch_env
from m3ctl.errors import BadInput, ConfigRejected, LaunchFailed, ServerUnreachable
from m3ctl.loadgen import runner
from m3ctl.loadgen.engine import stopped_by
from m3ctl.loadgen.runner import BenchConfig, BenchServerDown, engine_death
from m3ctl.runtime import prewarm
from m3ctl.runtime.base import port_in_use
from m3ctl.runtime.process import keep_prewarmed
from m3ctl.serving import serve as serving
from m3ctl.serving.diagnose import diagnose_log
from m3ctl.tuning import startup
from m3ctl.tuning.measure import TrialServerStopped, run_size, write_json
from m3ctl.tuning.plans import TRIAL_SMOKE, TrialPlans

#: Repeats of a bench run spoiled by in-service kernel JIT compilation (each repeat hits compiled kernels).
JIT_RERUNS = 2


class ServerSession:
    def __init__(
        self,
        ev: ServerEvaluator,
        plan,
        dep,
        trial_dir: Path,
        start_s: float,
        secrets: dict[str, str] | None = None,
        recorded: bool = False,
    ):
        self.ev, self.plan, self.dep, self.dir, self.start_s = ev, plan, dep, trial_dir, start_s
        self.secrets = secrets or {}  # the trial server's secret env: its key is what the benches send
        #: its deployment record was in the registry when it started: a record gone since was removed by a stop
        self.recorded = recorded
        #: (concurrency, fidelity) levels this server has run: a repeat at one of them skips the warm-up (the server
        #: has just served that load; its kernels for that batch size are compiled and its pools sized)
        self.levels_run: set[tuple[int, float]] = set()
        #: the median request latency (s) of the last run at each level: a repeat without a warm-up spreads its
        #: lanes over it (BenchConfig.stagger), as a first run spreads them over its warm-up's
        self.level_latency: dict[tuple[int, float], float] = {}

    def alive(self) -> bool:

        return serving.runtime_for(self.dep).is_alive(self.dep)

    def stopped_by(self) -> str | None:
        """Who stopped this server, when its stop was requested from outside the tune (its deployment record, there
        at its start, is gone: m3ctl.loadgen.engine.stopped_by, the wording a bench gives it too). None: not stopped
        on request."""
        if not self.recorded:
            return None
        return stopped_by(self.dep.name, self.ev.registry, self.dep.log_path)

    def _raise_if_stopped(self, where: str) -> None:
        """TrialServerStopped when :meth:`stopped_by` names a requested stop (``where``: when in the trial)."""
        who = self.stopped_by()
        if who is None:
            return
        study = self.dir.parent.parent
        raise TrialServerStopped(
            f"trial server {self.dep.name!r} was stopped {where} by {who}",
            f"the trial is kept as an interrupted launch (its finished runs saved); continue with "
            f"`m3ctl tune --resume {study}`, which measures again what the stop cut",
        )

    def measure(self, concurrency: int, fidelity: float) -> dict:
        """One bench run at ``concurrency``. A run during which the server JIT-compiled or autotuned a kernel
        (a latency spike of up to seconds: m3ctl.serving.kernels.jit_events) did not measure the steady state: it is
        kept as ``bench-cC-xF-jitN.json`` and repeated, at most ``JIT_RERUNS`` times. A further run at the same
        concurrency and fidelity in the trial folder (a repeat near the SLO boundary, m3ctl.tuning.search.measure_level)
        is saved as ``bench-cC-xF-rN.json`` (N = 1, 2, ...), so every run is kept. A repeat on this server at a
        level it has already run sends no warm-up requests (``tune.warmed_by``: the run before it warmed the server
        at that load; its lanes spread over that run's median latency instead of the warm-up's: BenchConfig.stagger);
        on the H200 a warm-up wave took 1.9-2.9 s at c=64-96 (docs/results/h200-study9.md).

        Raises:
            KeyboardInterrupt: the bench was interrupted (Ctrl-C; SIGTERM/SIGHUP: m3ctl.core.signals.Terminated): the partial run is saved and the level
                is not decided from it. On the H200 a call's timeout cut a run at 73 of 384 requests and the trial
                was recorded complete, its level c=96 "invalid" (docs/results/h200-study6.md); now the study stops
                as on any Ctrl-C and a resume recovers the trial from its finished levels.
            LaunchFailed: the engine died during the run."""

        cfg = BenchConfig(
            url=self.dep.url,
            model=self.dep.served_model_name,
            concurrency=concurrency,
            api_key=self.secrets.get("VLLM_API_KEY"),
            **run_size(self.ev.spec, self.ev.bench, concurrency, fidelity),
            num_gpus=self.ev.n_gpus_plan(self.plan),
            num_gpus_source="plan (tp x dp)",
            label=f"tune trial {self.dir.name} c={concurrency}",
            server_log=self.dep.log_path,
            deployment=self.dep.name,
            state_dir=str(self.ev.registry.root),
            # the energy meter samples this trial's GPUs only (a parallel study's neighbours run beside it)
            deployment_gpus=list(self.plan.gpus),
            **self.ev.bench,
        )
        warmed = (concurrency, fidelity) in self.levels_run
        if warmed:
            lat = self.level_latency.get((concurrency, fidelity)) if cfg.stagger == "auto" else None
            cfg = cfg.model_copy(update={"warmup": False, "num_warmups": 0, **({"stagger": lat} if lat else {})})
        stem = f"bench-c{concurrency}-x{fidelity:g}"
        rep = 0
        while (self.dir / f"{stem}{f'-r{rep}' if rep else ''}.json").exists():
            rep += 1
        stem += f"-r{rep}" if rep else ""
        reruns = 0
        while True:  # the bench reports the kernels the server compiled during its measured phase
            res = self._run(cfg, concurrency)
            failed = res.get("server_down") or res.get("failed") or res.get("engine_died")
            if failed and self.stopped_by() is not None:  # kept, then the study stops as on Ctrl-C
                write_json(self.dir / f"{stem}.json", res)
                self._raise_if_stopped(f"during the run at concurrency {concurrency}")
            if res.get("interrupted"):  # Ctrl-C (or a call's timeout) cut the run: kept, and the study stops
                write_json(self.dir / f"{stem}.json", res)
                cut = signals.interruption(res.get("interrupted_by"))  # Ctrl-C's, or SIGTERM/SIGHUP's (exit 128+n)
                cut.args = (f"the run at concurrency {concurrency} was interrupted ({res.get('interrupted_by')})",)
                raise cut
            if died := res.get("engine_died"):  # kept, then the trial is a crash with its cause (not an SLO miss)
                write_json(self.dir / f"{stem}.json", res)
                raise LaunchFailed(
                    f"{died['sentence']} (during the run at concurrency {concurrency})",
                    died.get("fix") or f"see {self.dir / 'server.log'}",
                    phase="serving",
                    log_path=self.dep.log_path,
                )
            jit = (res.get("server_jit_compiles") or {}).get("kernels", [])
            res["tune"] = {
                "trial_dir": str(self.dir),
                "argv": self.plan.argv,
                "fidelity": fidelity,
                "jit_events": jit,
                "jit_reruns": reruns,
                "warmed_by": "the previous run at this level on this server" if warmed else None,
            }
            if not jit or reruns >= JIT_RERUNS:
                break
            write_json(self.dir / f"{stem}-jit{reruns}.json", res)
            reruns += 1
        write_json(self.dir / f"{stem}.json", res)
        self.levels_run.add((concurrency, fidelity))
        if isinstance(med := res.get("median_e2el_ms"), int | float) and med > 0:
            self.level_latency[(concurrency, fidelity)] = med / 1000
        return res

    def _run(self, cfg, concurrency: int) -> dict:
        """One bench run; a server lost before it could start (unreachable, gone while the prompts were prepared)
        is a crash of the trial with the engine's cause (LaunchFailed), not an error of the study."""

        try:
            if getattr(self.ev, "isolate_bench", False):  # parallel trials: one bench run per process
                return run_bench_isolated(cfg, self.dep, getattr(self.ev, "bench_started", None))
            return runner.run_bench(cfg, sync_log=lambda: serving.runtime_for(self.dep).sync_log(self.dep))
        except (BadInput, ServerUnreachable, BenchServerDown) as e:
            self._raise_if_stopped(f"before the run at concurrency {concurrency}")
            died = engine_death(cfg)
            if died is None and isinstance(e, (BadInput, ServerUnreachable)) and self.alive():
                raise
            raise LaunchFailed(
                f"{died['sentence'] if died else e.message} (before the run at concurrency {concurrency})",
                (died or {}).get("fix") or f"see {self.dir / 'server.log'}",
                phase="serving",
                log_path=self.dep.log_path,
            ) from None

    def close(self) -> None:
        self.ev.stop_current()


class ServerEvaluator(TrialPlans):
    """Launches one real server per configuration (m3ctl's serve + bench libraries).

    Args:
        plan_base: plan() keyword arguments shared by every candidate (profile, overrides, extra_args,
            skip_checks, variant, max_model_len, runtime...).
        bench: BenchConfig fields for the workload (workload, input_len, output_len, seed, ...).
        name_prefix: deployment names are ``{name_prefix}-t{trial}``; resume stops any leftover of that prefix.
    """

    def open(self, cand: dict[str, Any], trial: int | str, on_event: Callable[[str], None]) -> ServerSession:
        """Start the server of ``cand``; ``trial`` names it (``{prefix}-t{trial}``) and its folder
        (``trials/NNNN``, or ``trials/base`` for the baseline). A later start of the same trial (its confirmation on
        a fresh server, a relaunch) keeps the earlier start's records: its own are ``start-N.json`` and
        ``server-N.log`` (:func:`start_suffix`)."""

        name = f"{self.prefix}-t{trial}"
        tdir = self.dir / "trials" / (f"{trial:04d}" if isinstance(trial, int) else str(trial))
        tdir.mkdir(parents=True, exist_ok=True)
        p = self.trial_plan(cand, trial)
        write_json(tdir / "config.json", {"config": cand, "argv": p.argv, "command": p.command_line()})
        self.current, self.trial_dir, self.suffix = name, tdir, start_suffix(tdir)
        self._mark_running(name, trial)

        secrets = launch_env(p)  # a server that inherits VLLM_API_KEY requires it: readiness and benches send it
        warm_note = None
        if self.fast_starts:
            self.cache_root.mkdir(parents=True, exist_ok=True)
            if p.runtime == "process":  # one process importing vLLM for the next trial while this one starts
                warm_note = keep_prewarmed(p, self.registry, secrets, self.warm_prefix)
        t0 = time.monotonic()
        try:
            res = self._launch(p, secrets, on_event)
        except LaunchFailed as e:
            e.elapsed_s = time.monotonic() - t0
            self._save_log(name, tdir)
            self.registry.remove(name)  # the trial's folder keeps its log and the study its cause
            self.current = None
            self._mark_stopped(name)
            raise
        except BaseException:
            self._save_log(name, tdir)
            self.current = None
            self._mark_stopped(name)
            raise
        start_s = time.monotonic() - t0
        self._record_start(res, tdir, start_s, warm_note, p.env)
        return ServerSession(self, p, res.deployment, tdir, start_s, secrets, self.registry.exists(name))

    def _launch(self, p, secrets: dict[str, str], on_event: Callable[[str], None]):
        """launch_and_wait with the trial smoke: the quick smoke (a long prompt of several KV/MSA blocks and a
        mixed batch), so a trial whose server would die on the workload's prompts fails here, with the cause,
        instead of as a bench run. A start that failed reading the study's compile cache back (the engine's own
        error, m3ctl.serving.diagnose: component ``torch-compile-cache``) clears the cache and starts once more."""

        def go():
            return serving.launch_and_wait(
                p,
                registry=self.registry,
                secret_env=secrets,
                smoke=TRIAL_SMOKE,
                on_event=lambda e: on_event(f"{e.phase} {e.status}") if e.status != "start" else None,
            )

        try:
            return go()
        except LaunchFailed as e:
            d = diagnose_log(e.log_path or self.registry.log_path(p.name))
            if not (self.fast_starts and d is not None and startup.is_corrupt_cache(d.component_id)):
                raise
            startup.clear_cache(self.cache_root)
            self.cache_root.mkdir(parents=True, exist_ok=True)
            on_event("compile cache unreadable: cleared, starting again")
            self.registry.remove(p.name)
            return go()

    @property
    def warm_prefix(self) -> str:
        """Name prefix of this evaluator's prewarmed processes (m3ctl.runtime.prewarm), one set per port."""
        return f"{self.prefix}-warm{self.port}-"

    def discard_prewarmed(self) -> int:
        """End this evaluator's and its slots' waiting prewarmed processes (the study's last cleanup)."""

        return sum(prewarm.discard(c.warm_prefix) for c in [self, *self.__dict__.get("_slots", [])])

    def _record_start(
        self, res, tdir: Path, start_s: float, warm_note: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """``trials/NNNN/start.json``: the start broken down from the server's own log (m3ctl.tuning.startup),
        with the study's start measures and the wall seconds the tune counted for it: whether the server ran in a
        prewarmed process and how its engine-core process started (``fork``, ``spawn``)."""

        dep = res.deployment
        try:
            text = serving.runtime_for(dep).log_text(dep, tail_bytes=5_000_000)
        except OSError:
            text = ""
        ready_at = dep.started_at + res.readiness.time_to_ready_s if dep.started_at else None
        b = startup.start_breakdown(text, launched_at=dep.started_at, ready_at=ready_at, smoke_s=dep.smoke_s)
        write_json(
            tdir / f"start{self.suffix}.json",
            {
                **b.to_json(),
                "start_s": round(start_s, 2),
                "fast_starts": self.fast_starts,
                "cache_root": str(self.cache_root) if self.fast_starts else None,
                "prewarmed": dep.prewarmed,
                "prewarm": warm_note,
                "engine_process": startup.engine_process_used(env, text),
                "kernel_cache": (env or {}).get(startup.facts().kernel_cache.env),
            },
        )

    def _save_log(self, name: str, tdir: Path) -> None:
        src, dst = self.registry.log_path(name), tdir / f"server{self.suffix}.log"
        if src.exists():
            try:
                shutil.copyfile(src, dst)
            except OSError:  # a full disk: no truncated copy (the log stays in the state dir)
                dst.unlink(missing_ok=True)

    def stop_current(self) -> None:

        name, tdir = self.current, self.trial_dir
        if name is None:
            return
        try:
            if self.registry.exists(name):
                serving.stop([name], registry=self.registry)
        finally:
            if tdir is not None:
                self._save_log(name, tdir)
            self.current = None
            self._mark_stopped(name)

    # ------------------------------------------------------------------ parallel trials (m3ctl.tuning.parallel)
    #: Run each bench in a child process (a slot evaluator's sessions run beside others': m3ctl.loadgen.runner allows
    #: one run per process).
    isolate_bench = False

    def _running_state(self) -> tuple[threading.Lock, dict[str, dict]]:
        """The trial servers running now (name -> running.json record) and its lock, shared with the slot
        evaluators (:meth:`for_slot`)."""
        st = self.__dict__.get("_running_recs")
        if st is None:
            st = self.__dict__["_running_recs"] = (threading.Lock(), {})
        return st

    def _mark_running(self, name: str, trial: int | str) -> None:
        lock, recs = self._running_state()
        with lock:
            recs[name] = {"name": name, "trial": trial, "state_dir": str(self.registry.root)}
            self._write_running(recs)

    def _mark_stopped(self, name: str) -> None:
        lock, recs = self._running_state()
        with lock:
            recs.pop(name, None)
            self._write_running(recs)

    def _write_running(self, recs: dict[str, dict]) -> None:
        """``running.json``: one trial server: its record ``{name, trial, state_dir}`` (the file of a serial study,
        which older m3ctl reads); several (parallel trials): the first one's record plus ``running``, the list of
        every record; none: no file."""
        path = self.dir / "running.json"
        rows = list(recs.values())
        if not rows:
            path.unlink(missing_ok=True)
        elif len(rows) == 1:
            write_json(path, rows[0])
        else:
            write_json(path, {**rows[0], "running": rows})

    def for_slot(self, gpus, port: int) -> ServerEvaluator:
        """This evaluator for one of several trials at once: its plans pin ``gpus`` (physical GPU indices:
        :attr:`m3ctl.assess.request.PlanRequest.gpus`, so the planner sets the server's visible devices) and listen
        on ``port``; it has its own current server, runs its bench runs in a child process and shares
        ``running.json`` with this one. :meth:`stop_slots` stops the servers of every slot evaluator made here."""
        self._running_state()  # created before the copy, so the copy shares it
        c = copy.copy(self)
        c.plan_base = {**self.plan_base, "gpus": [int(g) for g in gpus]}
        c.port = int(port)
        c.current = c.trial_dir = None
        c.isolate_bench = True
        self.__dict__.setdefault("_slots", []).append(c)
        return c

    def abort(self) -> bool:
        """Stop this evaluator's trial server from another thread (a parallel study being cancelled), whether it
        is still starting or measuring; safe to repeat (the owning thread's open/close clean up). Returns True when a
        server was stopped."""

        name = self.current
        if name is None or not self.registry.exists(name):
            return False
        serving.stop([name], registry=self.registry)
        return True

    def bench_started(self, proc: subprocess.Popen | None) -> None:
        """The bench process of this slot's current run (None once it ended): :meth:`interrupt` signals it."""
        self.__dict__["_bench_proc"] = proc

    def interrupt(self, signum: int) -> bool:
        """Forward the signal that interrupts the study (SIGINT, SIGTERM, SIGHUP) to this slot's running bench process,
        from the main thread: it ends its run as any bench does, what finished kept (``interrupted``), and the trial's
        thread saves it in the trial folder before the server is stopped. Returns whether a bench was running."""
        proc = self.__dict__.get("_bench_proc")
        if proc is None or proc.poll() is not None:
            return False
        try:
            proc.send_signal(signum)
        except OSError:  # it ended meanwhile
            return False
        return True

    def stop_slots(self) -> None:
        """Stop the server of every slot evaluator :meth:`for_slot` made (the study's last cleanup)."""
        for c in self.__dict__.get("_slots", []):
            c.stop_current()


def start_suffix(tdir: Path) -> str:
    """Suffix of the records of the next start in trial folder ``tdir``: ``""`` for its first start
    (``start.json``, ``server.log``), ``"-N"`` for its N-th (a confirmation on a fresh server, a relaunch)."""
    n = 1 + max(sum(1 for _ in tdir.glob("start*.json")), sum(1 for _ in tdir.glob("server*.log")))
    return "" if n == 1 else f"-{n}"


def run_bench_isolated(cfg, dep, started: Callable[[subprocess.Popen | None], None] | None = None) -> dict:
    """:func:`m3ctl.loadgen.runner.run_bench` of ``cfg`` against deployment ``dep`` in a Python process of its own
    (:mod:`m3ctl.tuning.benchchild`), so trials running at once each measure with their own load generator (run_bench
    allows one run per process: its stall tracker and progress sink are process-wide).

    ``started`` is told the bench process (and None once it ended): the study forwards a signal to it
    (:meth:`ServerEvaluator.interrupt`), and its result comes back ``interrupted`` with what finished.

    Raises:
        BadInput, BenchServerDown: as run_bench (the same message and hint).
        KeyboardInterrupt: a signal reached it before its measured phase (:func:`m3ctl.core.signals.interruption`).
        LaunchFailed: the bench process ended without a result (its exit status and last stderr line).
    """

    root = str(Path(m3ctl.__file__).resolve().parent.parent)  # the child imports this m3ctl
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    with tempfile.TemporaryDirectory(prefix="m3ctl-bench-") as d:
        inp, out = Path(d) / "in.pkl", Path(d) / "out.pkl"
        inp.write_bytes(pickle.dumps((cfg, dep)))
        with subprocess.Popen(
            [sys.executable, "-m", "m3ctl.tuning.benchchild", str(inp), str(out)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        ) as p:
            (started or (lambda _p: None))(p)
            try:
                _, stderr = p.communicate()
            finally:
                (started or (lambda _p: None))(None)
        if not out.exists():
            tail = (stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise LaunchFailed(
                f"the bench run's process ended without a result (exit {p.returncode}): {tail}",
                f"see {dep.log_path or 'the server log'}",
                phase="serving",
                log_path=dep.log_path,
            )
        res = pickle.loads(out.read_bytes())
    if "error" in res:
        kinds = {"BenchServerDown": BenchServerDown, "BadInput": BadInput, "ServerUnreachable": ServerUnreachable}
        raise kinds[res["error"]](res["message"], res["hint"])
    if "result" not in res:  # a signal before its measured phase: nothing measured
        raise signals.interruption(res.get("interrupted"))
    return res["result"]


def trial_ports(host: str, first: int, n: int, tries: int = 100) -> tuple[int, ...]:
    """``n`` API ports for trial servers running at once: ``first``, then the next ports up that are free now
    (m3ctl.runtime.base.port_in_use). ``first`` is the study's port and is kept even when taken (its trial's
    pre-flight then names the holder, as in a serial study).

    Raises:
        ConfigRejected: fewer than ``n`` free ports among the ``tries`` ports above ``first``.
    """

    out = [first]
    p = first
    while len(out) < n and p < min(65535, first + tries):
        p += 1
        if not port_in_use(host, p):
            out.append(p)
    if len(out) < n:
        raise ConfigRejected(
            f"{n} trials at once need {n} API ports from {first} up; only {len(out)} of the next {tries} are free",
            "pass --port with a free range above it, or --parallel-trials 1",
        )
    return tuple(out)


def stop_leftovers(study_dir: Path, prefix: str, registry) -> list[str]:
    """Stop servers a killed tune left behind: those in ``running.json`` (its record, and every record of its
    ``running`` list when trials ran in parallel) and any deployment named ``{prefix}-t*`` in the registry.
    Returns the names stopped."""

    names = {d.name for d in registry.list() if d.name.startswith(prefix + "-t")}
    run = Path(study_dir) / "running.json"
    if run.exists():
        try:
            data = json.loads(run.read_text())
            names.add(data["name"])
            names.update(r["name"] for r in data.get("running", []))  # parallel trials: every running server
        except (ValueError, KeyError, TypeError):
            pass
    stopped = []
    for n in sorted(names):
        if registry.exists(n):
            serving.stop([n], registry=registry)
            stopped.append(n)
    run.unlink(missing_ok=True)
    return stopped
