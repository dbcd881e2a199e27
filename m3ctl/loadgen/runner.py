"""Run one benchmark, or a sweep of them: the stages in order, with one async core for the sync and async entries.

A run is config -> prepare -> drive -> result -> validity, each a module with a typed output:

- m3ctl.loadgen.config: :class:`BenchConfig`, the run's settings (declared once), checked by
  m3ctl.loadgen.inputs.validate before anything is sent;
- m3ctl.loadgen.prepare: :class:`~m3ctl.loadgen.prepare.Prepared` (reachability, tokenizer, the workload's
  requests with fresh prompt text, warm-ups, the samplers of the measured phase);
- m3ctl.loadgen.drive (one client process; m3ctl.loadgen.procs for ``client_procs > 1``): the outputs and the
  clients' :class:`~m3ctl.loadgen.drive.ClientStats`;
- m3ctl.loadgen.result: the result JSON (vLLM's keys plus m3ctl's), whose ``validity`` block
  m3ctl.loadgen.validity writes.

Load model (as ``vllm bench serve``, vllm/benchmarks/serve.py): requests are scheduled at ``--request-rate``
(``inf``: all at t=0; otherwise gamma-distributed gaps with shape ``burstiness`` and mean ``1/rate``, Poisson at
burstiness 1) and at most ``--concurrency`` are in flight (closed loop). With ``--duration`` the run stops issuing
requests after that many seconds (the workload is cycled); in-flight requests finish and count.

:func:`run_bench` and :func:`arun_bench` (and the sweeps) run the same coroutine (:func:`_arun`); they differ in
how a blocking stage runs (inline on the run's own event loop, or in a worker thread beside the caller's loop)
and in how a Ctrl-C reaches the measured phase (:class:`_Mode`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from m3ctl.catalog.lazy import lazy_module
from m3ctl.core import signals
from m3ctl.errors import BadInput, BenchServerDown, ServerUnreachable
from m3ctl.loadgen import procs, sink
from m3ctl.loadgen import sweep as sweeps
from m3ctl.loadgen.client import RequestOutput
from m3ctl.loadgen.config import MAX_PROMPTS, MAX_RUN_PROMPT_TOKENS, BenchConfig, run_length
from m3ctl.loadgen.drive import ClientStats, drive
from m3ctl.loadgen.engine import engine_death
from m3ctl.loadgen.inputs import prompt_tokens_per_request, validate
from m3ctl.loadgen.prepare import Prepared, check_reachable, prepare, tokenizer_for
from m3ctl.loadgen.prompts import Tokenizer
from m3ctl.loadgen.report import sweep_doc
from m3ctl.loadgen.result import finish
from m3ctl.loadgen.settings import BenchSettings
from m3ctl.loadgen.sweep import Sweep
from m3ctl.loadgen.validity import BenchServerStalled, run_failure
from m3ctl.results import BenchResult, BenchSweep

if TYPE_CHECKING:
    import httpx
else:
    httpx = lazy_module("httpx")

#: Names other modules import from here (the stages' own modules hold them).
__all__ = [
    "MAX_PROMPTS",
    "MAX_RUN_PROMPT_TOKENS",
    "BenchConfig",
    "BenchServerDown",
    "BenchServerStalled",
    "arun_bench",
    "arun_sweep",
    "engine_death",
    "run_bench",
    "run_failure",
    "run_sweep",
    "validate",
]

T = TypeVar("T")

# The stage seams of a run (tests replace them here): the server check and the tokenizer it builds.
_check_reachable = check_reachable
_tokenizer = tokenizer_for

_RUN_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_run() -> Iterator[list[Callable[[], object]]]:
    """One run at a time per process: the stall tracker (``client.PROGRESS``) and the progress sink are
    process-wide. Raises BadInput for a second concurrent run (await runs one after the other). Yields a list of
    callables run at the end whatever happens (the run's samplers' stop)."""
    if not _RUN_LOCK.acquire(blocking=False):
        raise BadInput(
            "another bench run is in progress in this process",
            "await the running one first (runs in one process go one after the other)",
        )
    cleanup: list[Callable[[], object]] = []
    try:
        yield cleanup
    finally:
        for fn in cleanup:
            fn()
        _RUN_LOCK.release()


def _prepare_reachable(cfg: BenchConfig, tok: Tokenizer | None, sync_log) -> Prepared:
    """:func:`m3ctl.loadgen.prepare.prepare` with ``tok``, else a tokenizer built for this run (:func:`_tokenizer`)."""
    return prepare(cfg, tok or _tokenizer(cfg), tok is None, sync_log)


def _prepare(cfg: BenchConfig, tok: Tokenizer | None, sync_log, checked: bool = False) -> Prepared:
    """Everything before the first request (blocking I/O: the checks unless ``checked``, reachability, tokenizer,
    KV block size).

    Raises:
        BadInput: as m3ctl.loadgen.inputs.validate; as :func:`~m3ctl.loadgen.prepare.check_reachable`.
        ServerUnreachable: the server never answered (:func:`~m3ctl.loadgen.prepare.check_reachable`).
        BenchServerDown: it answered, then went away while the prompts were prepared (its engine's death named
            when ``cfg.deployment`` is known).
    """
    t_begin = time.perf_counter()
    if not checked:
        validate(cfg)
    try:
        _check_reachable(cfg)
    except ServerUnreachable as e:  # a deployment m3ctl knows whose engine is dead: say so, not "start it"
        if died := engine_death(cfg):
            raise BenchServerDown(
                f"{e.message}: {died['sentence']}",
                (f"{died['fix']}; " if died.get("fix") else "") + f"`m3ctl logs {cfg.deployment}` shows its log",
            ) from None
        raise
    try:
        prep = _prepare_reachable(cfg, tok, sync_log)
        prep.times.update(begin=t_begin, prepared=time.perf_counter())
        return prep
    except (httpx.HTTPError, ConnectionError) as e:
        raise _lost_preparing(cfg, e) from None


def _lost_preparing(cfg: BenchConfig, e: Exception) -> BenchServerDown:
    """The error of a server lost while the prompts were prepared (``e``: the failed request's error)."""
    died = engine_death(cfg)
    what = died["sentence"] if died else f"server at {cfg.url} went away ({type(e).__name__})"
    return BenchServerDown(
        f"lost the server while bench prepared the prompts (nothing was measured): {what}",
        ((died or {}).get("fix") or "")
        + ("; " if died and died.get("fix") else "")
        + (
            f"`m3ctl logs {cfg.deployment}` shows its log"
            if cfg.deployment
            else "check the server (`m3ctl status`, its log)"
        ),
    )


# ----------------------------------------------------------------------------- the one core, two modes
async def _inline(fn: Callable[..., T], /, *args: Any) -> T:
    """Run a blocking stage on the run's own loop (nothing else runs on it)."""
    return fn(*args)


async def _signals_cancel(coro: Coroutine[Any, Any, T]) -> T:
    """Await the measured phase ``coro`` as a task that a signal of the policy (m3ctl.core.signals: SIGINT,
    SIGTERM, SIGHUP) cancels, as asyncio.Runner does for Ctrl-C: the first one cancels it (the measured phase keeps
    what finished: ``interrupted``, and which signal: ``interrupted_by``), a second raises its interruption; one
    that ends cancelled after a signal raises it. Off the main thread, or with a SIGINT handler of the caller's,
    a plain await."""
    task = asyncio.ensure_future(coro)
    if not signals.handles_interrupts():
        return await task
    loop = asyncio.get_running_loop()

    def cancel() -> bool:
        if task.done():
            return False
        task.cancel()
        loop.call_soon_threadsafe(lambda: None)  # wake the loop from its select()
        return True

    with signals.Canceller(cancel) as cx:
        try:
            res = await task
        except asyncio.CancelledError:
            if cx.signum is not None and task.cancelled():
                raise signals.interruption(cx.signum) from None
            raise
    stats = res[1] if isinstance(res, tuple) and len(res) > 1 else None
    if cx.signum is not None and isinstance(stats, ClientStats) and stats.interrupted:
        stats.interrupted_by = signals.signal_name(cx.signum)
    return res


@dataclass(frozen=True)
class _Mode:
    """How the core runs a blocking stage (``offload``) and the one-process measured phase (``drive``)."""

    offload: Callable[..., Awaitable[Any]]
    drive: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]]


#: run_bench: the run's own loop; blocking stages inline, a signal (Ctrl-C, SIGTERM, SIGHUP) cancels the measured
#: phase.
_SYNC = _Mode(_inline, _signals_cancel)
#: arun_bench: the caller's loop; blocking stages in worker threads, cancelling the caller's task ends the
#: measured phase (the drive is a task of its own: it keeps what finished and returns).
_ASYNC = _Mode(asyncio.to_thread, asyncio.ensure_future)


async def _generate(prep: Prepared, progress, mode: _Mode) -> tuple[list[RequestOutput], float, list[ClientStats]]:
    """The warm-ups and the measured phase: outputs, duration (first dispatch to last completion), client stats."""
    cfg = prep.cfg
    if not prep.overlapped and (n := procs.procs_for(cfg, prep.job)) > 1:
        return await mode.offload(procs.execute, cfg, prep.job, prep.warmups, n, prep.before, progress)
    hook = prep.before
    before = (lambda: mode.offload(hook)) if hook is not None else None
    sink.set_emit(progress.put if progress is not None else None)
    try:  # the job's prompts may still be in the making (prep.overlapped): drive waits for them
        outs, st, t0 = await mode.drive(drive(cfg, prep.built, None, prep.warmups, before))
    except (httpx.HTTPError, ConnectionError) as e:
        if prep.built.done() and prep.built.exception() is e:
            raise _lost_preparing(cfg, e) from None
        raise
    finally:
        sink.set_emit(None)
    return outs, procs.duration(outs, t0), [st]


async def _arun(cfg: BenchConfig, tok: Tokenizer | None, progress, sync_log, mode: _Mode, checked: bool = False):
    """One run, every stage: prepare, drive, result (``checked``: the sweep checked ``cfg`` already)."""
    with _one_run() as cleanup:
        prep = await mode.offload(_prepare, cfg, tok, sync_log, checked)
        cleanup.append(prep.stop_sampling)
        outs, dur, cstats = await _generate(prep, progress, mode)
        return await mode.offload(finish, prep, outs, dur, cstats, sync_log)


async def _asweep(
    cfg: BenchConfig,
    concurrencies: list[int | None],
    progress,
    sync_log,
    input_lens: list[int] | None,
    output_lens: list[int] | None,
    mode: _Mode,
) -> list[dict]:
    """A sweep, every level through :func:`_arun` (m3ctl.loadgen.sweep.Sweep keeps its state)."""
    sw = await mode.offload(Sweep, cfg, concurrencies, input_lens, output_lens)
    try:
        for level in sw.levels():
            one = _run_length(level)
            with progress(one) if progress else contextlib.nullcontext(None) as prog:
                try:
                    res = await _arun(one, sw.tok, prog, sync_log, mode, checked=True)
                except (BadInput, ServerUnreachable, BenchServerDown) as e:
                    if not await mode.offload(sw.lost, one, e):
                        raise
                    continue
            await mode.offload(sw.add, res)
        return sw.runs
    finally:
        sw.close()


def _on_new_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` on a new event loop (uvloop when installed), closed after it with its tasks."""
    loop = sink.new_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        try:
            tasks = asyncio.all_tasks(loop)
            for t in tasks:
                t.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()


def _run_sync(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``main()`` to its end from synchronous code. In a thread whose loop is already running (a Jupyter cell),
    that loop cannot be re-entered: the run gets its own loop in a worker thread, and a Ctrl-C
    (KeyboardInterrupt) while waiting for it stops it as in a worker process (``sink.STOP``): partial results."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # SIGTERM/SIGHUP end the run as Ctrl-C does (m3ctl.core.signals): nothing measured is lost
        with signals.stop_signals_as_interrupt() if signals.handles_interrupts() else contextlib.nullcontext():
            return _on_new_loop(main)
    stop = threading.Event()
    sink.set_stop(stop)
    try:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="m3ctl-bench") as pool:
            fut = pool.submit(_on_new_loop, main)
            try:
                return fut.result()
            except KeyboardInterrupt:
                stop.set()
                return fut.result(timeout=60)
    finally:
        sink.set_stop(None)


async def _abench(s: BenchSettings, mode: _Mode) -> BenchResult | BenchSweep:
    """A checked bench call: one run, or a sweep of its levels; the typed result."""
    levels = s.plan
    if len(levels) > 1:
        runs = await _asweep(s.cfg, s.levels, s.progress, s.sync_log, s.input_lens, s.output_lens, mode)
    else:
        cfg = _run_length(s.cfg)
        with s.progress(cfg) if s.progress is not None else contextlib.nullcontext(None) as prog:
            runs = [await _arun(cfg, None, prog, s.sync_log, mode, checked=True)]
    return bench_result(runs, levels, s.slo)


def _run_length(cfg: BenchConfig) -> BenchConfig:
    """The level's config with its default run length (m3ctl.loadgen.config.run_length)."""
    return run_length(cfg, prompt_tokens_per_request(cfg))


def bench_result(runs: list[dict], levels: list[sweeps.Level], slo: str = "") -> BenchResult | BenchSweep:
    """The typed result of a bench call's runs: a BenchResult (one level) or a BenchSweep (its ``sweep`` block:
    m3ctl.loadgen.report.sweep_doc, with ``slo``'s capacity)."""
    if len(levels) > 1:
        return BenchSweep.model_validate(
            {**sweep_doc(runs, *sweeps.axes(levels), slo=slo), "runs": [BenchResult.from_dict(r) for r in runs]}
        )
    return BenchResult.from_dict(runs[0])


# ----------------------------------------------------------------------------- entries
def run(settings: BenchSettings) -> BenchResult | BenchSweep:
    """Run a checked bench call (m3ctl.loadgen.settings.check): :func:`run_bench` or :func:`run_sweep` of its
    levels, without checking its settings again. Errors: as those."""
    return _run_sync(lambda: _abench(settings, _SYNC))


async def arun(settings: BenchSettings) -> BenchResult | BenchSweep:
    """:func:`run` as a coroutine (:func:`arun_bench`, :func:`arun_sweep`)."""
    return await _abench(settings, _ASYNC)


def run_bench(cfg: BenchConfig, tok: Tokenizer | None = None, progress=None, sync_log=None) -> dict:
    """Run the benchmark and return the result JSON (vLLM keys plus m3ctl's additions).

    A server that stops accepting connections mid-run (``SERVER_DOWN_AFTER`` connection-refused
    results in a row) ends the run early: the result holds what finished, ``server_down: true``,
    ``failed_by_kind`` and ``not_sent``, and is marked invalid (the CLI exits 4, see ``BenchServerDown``).

    Called from a thread whose event loop is running (a Jupyter cell), the run goes on its own event loop in a
    worker thread and this call blocks until it is done; ``await arun_bench(...)`` runs it on the caller's loop
    instead.

    Args:
        tok: a tokenizer to reuse (sweeps build it once); default: the server's ``/tokenize``.
        sync_log: called before reading ``cfg.server_log`` (a runtime whose log is copied, e.g. Docker's
            ``sync_log``); None when the server writes the file itself.
        progress: a :class:`m3ctl.loadgen.progress.LiveProgress` (or any object with ``put(event)``,
            ``attach(queue)`` and ``detach(queue)``) fed with the measured phase's send/finish events.

    Raises:
        BadInput: invalid config (endpoint, range ratio, workload), no way to tokenize prompts, or another
            run already in progress in this process.
    """
    return _run_sync(lambda: _arun(cfg, tok, progress, sync_log, _SYNC))


async def arun_bench(cfg: BenchConfig, tok: Tokenizer | None = None, progress=None, sync_log=None) -> dict:
    """:func:`run_bench` as a coroutine, for a caller whose event loop is already running (Jupyter, an async
    service): the same result dict, the same errors.

    The blocking steps (reachability check, tokenizer, prompt building, ``/metrics`` scrapes, the result) run in
    a worker thread (``asyncio.to_thread``); a one-process load generator (``client_procs`` 1) runs as a task on
    the caller's loop (its lag is measured and reported as ``validity.client_loop_lag_*``: other work on that
    loop delays the client as it would any client); with ``client_procs > 1`` the worker processes are driven
    from a worker thread. Cancelling the awaiting task while requests are being sent ends the run early as Ctrl-C
    does on the command line: requests in flight are cancelled and the partial result (``interrupted: true``,
    invalid) is returned, so nothing measured is lost (cancelled before the first request or while the result
    is assembled, it raises ``CancelledError``).

    Raises:
        BadInput: as :func:`run_bench`.
    """
    return await _arun(cfg, tok, progress, sync_log, _ASYNC)


def run_sweep(
    cfg: BenchConfig,
    concurrencies: list[int | None],
    progress=None,
    sync_log=None,
    *,
    input_lens: list[int] | None = None,
    output_lens: list[int] | None = None,
) -> list[dict]:
    """One run per level: ``input_lens`` x ``output_lens`` x ``concurrencies`` (m3ctl.loadgen.sweep.plan; None or
    [] takes ``cfg``'s value), the same workload shape and seed, fresh prompt text at every level unless
    ``cfg.prompt_salt`` pins it; the tokenizer is built once, and replaced by the server's ``/tokenize`` when a
    level found the client's counting the prompts differently (m3ctl.loadgen.result realigns). ``sync_log``: as
    :func:`run_bench`.

    Each result gets ``overload`` (m3ctl.loadgen.sweep.overload); with ``cfg.stop_on_overload`` an overloaded
    level ends its input/output pair's climb: ``sweep_stop`` {reason, skipped: [levels]} in its result.

    ``progress``: optional ``callable(run_cfg)`` returning a context manager that yields a progress
    sink for that run (see :func:`run_bench`) or None.

    Raises:
        BadInput: as :func:`run_bench`; a length outside 1..MAX_REQUEST_TOKENS.
    """
    return _run_sync(lambda: _asweep(cfg, concurrencies, progress, sync_log, input_lens, output_lens, _SYNC))


async def arun_sweep(
    cfg: BenchConfig,
    concurrencies: list[int | None],
    progress=None,
    sync_log=None,
    *,
    input_lens: list[int] | None = None,
    output_lens: list[int] | None = None,
) -> list[dict]:
    """:func:`run_sweep` as a coroutine (each level as :func:`arun_bench` runs it)."""
    return await _asweep(cfg, concurrencies, progress, sync_log, input_lens, output_lens, _ASYNC)
