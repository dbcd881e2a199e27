"""The API of ``m3ctl bench``: sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

from m3ctl.api._args import _checked
from m3ctl.loadgen import runner, settings
from m3ctl.loadgen.config import BenchConfig
from m3ctl.loadgen.target import resolve_target
from m3ctl.loadgen.validity import run_failure
from m3ctl.results import BenchResult, BenchSweep
from m3ctl.serving.diagnose import DiagContext, diagnose_log

if TYPE_CHECKING:
    from pydantic import StrictInt


# ----------------------------------------------------------------------------- bench


@overload
def bench(
    url: str | None = None,
    *,
    concurrency: int | None = None,
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    **options: Any,
) -> BenchResult: ...
@overload
def bench(
    url: str | None = None,
    *,
    concurrency: Sequence[int],
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    **options: Any,
) -> BenchResult | BenchSweep: ...


@_checked
def bench(
    url: str | None = None,
    *,
    concurrency: StrictInt | Sequence[StrictInt] | None = None,
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    slo: str = "",
    progress: Callable[[BenchConfig], Any] | None = None,
    on_note: Callable[[str], None] | None = None,
    **options: Any,
) -> BenchResult | BenchSweep:
    """Load-test an OpenAI-compatible endpoint (``m3ctl bench``); vLLM-compatible metrics plus m3ctl's.

    Args:
        url: base URL (``http://HOST:PORT``, a trailing ``/v1`` is dropped), or ``deployment``: an m3ctl
            deployment's name (its URL, model, key, log and GPU count).
        concurrency: requests in flight (closed loop); a list of several runs a sweep (one run per level, with
            a warm-up at each). None: no cap (with ``request_rate`` the arrivals decide).
        model: the model id (default: the deployment's; for a ``url``, the one the server serves, or of several
            names, the model of the m3ctl deployment at that address, else the first ``/v1/models`` lists, as
            ``vllm bench serve`` does; the choice is logged on the ``m3ctl.bench`` logger and is the result's
            ``model_id``).
        api_key: bearer key (default ``OPENAI_API_KEY``, the deployment's, ``VLLM_API_KEY``); never stored.
        num_gpus: GPUs behind the endpoint, for tok/s per GPU (default: the deployment's).
        warmup: warm up at each level before measuring (default: on for a sweep).
        slo: with a sweep, an SLO (``"p90_tpot_ms<=30"``, m3ctl.loadgen.slo) whose capacity the result's
            ``sweep["capacity"]`` gives by the tune's capacity rule (m3ctl.loadgen.capacity.sweep_capacity).
        options: :class:`~m3ctl.loadgen.runner.BenchConfig` fields with their units: ``num_prompts``,
            ``request_rate`` (req/s, default inf), ``burstiness``, ``duration_s``, ``input_len``/``output_len``
            (tokens; a list sweeps it, input x output x concurrency: m3ctl.loadgen.sweep), ``trace_path`` (a JSONL
            trace to replay, m3ctl.loadgen.trace) with ``trace_time_scale``, ``max_ttft_s`` and ``stop_on_overload``
            (a sweep's early stop), ``endpoint`` (``completions``/``chat``), ``workload`` (``random``, ``dataset``,
            ``prefix-repetition``, ``agentic``), ``percentiles`` (list, 0-100), ``goodput_slo_ms``
            ({ttft|tpot|e2el: ms}), ``tokenizer`` (dir), ``usd_per_gpu_hour``, ``client_procs``, ``seed``...
        progress: live progress: called with each run's config, returns a context manager whose value (a
            m3ctl.loadgen.progress sink, or None) the run reports its requests to (``m3ctl bench``'s live line).
        on_note: called with the one-line note of a model picked among several served names (default: logged
            on the ``m3ctl.bench`` logger).

    Returns:
        :class:`~m3ctl.results.BenchResult` (one level), or :class:`~m3ctl.results.BenchSweep` for several
        levels. A run the server broke (``server_down``, ``stalled``) or that is BENCH-INVALID is returned, not
        raised: check ``result.valid`` and ``result.validity.reasons`` (nothing measured is lost).

    Inside a running event loop (a Jupyter cell) this call blocks that loop while the load generator runs on
    its own loop in a worker thread; ``await abench(...)`` runs it on the caller's loop instead.

    Raises:
        BadInput: no endpoint, an unreachable server, a model it does not serve, a bad option, no tokenizer;
            another run in progress in this process.
        BenchServerDown: the server was lost while the prompts were prepared, or the m3ctl deployment behind the
            endpoint is already dead (its death named: m3ctl.serving.lifecycle). A death during the run is returned in the
            result instead (``engine_died``, ``server_down``, invalid).
    """
    return runner.run(
        settings.check(url, deployment, model, concurrency, api_key, num_gpus, warmup, options, slo, on_note, progress)
    )


def bench_error(
    result: BenchResult | BenchSweep,
    url: str | None = None,
    *,
    deployment: str | None = None,
    saved: str | None = None,
) -> Exception | None:
    """The error a finished :func:`bench` of ``url`` / ``deployment`` ends with (``m3ctl bench``'s exit), or
    None when every run is valid: the server went down (BenchServerDown, exit 4; for a deployment, with the root
    cause found in its server log: m3ctl.serving.diagnose), it stalled (BenchServerStalled, exit 4), or a run is
    BENCH-INVALID (ChecksFailed, exit 1). ``saved``: where the results were written (None: nowhere), named in the
    hint so nothing measured is lost. Nothing is sent to the server.

    Raises:
        BadInput: no endpoint; NotFound: an unknown deployment.
    """
    runs = [r.to_dict() for r in result.runs] if hasattr(result, "runs") else [result.to_dict()]
    if stopped := next((r["server_stopped"] for r in runs if r.get("server_stopped")), None):
        return run_failure(runs, stopped["url"], saved)  # `m3ctl stop` removed its record: nothing to resolve
    t = resolve_target(url, deployment=deployment, lookup_model=False)
    diag = None
    if t.server_log and any(r.get("server_down") for r in runs):  # name the root cause from the log (N09)
        t.sync_log() if t.sync_log else None
        diag = diagnose_log(t.server_log, context=DiagContext(argv=t.argv, phase="serving"))
    return run_failure(runs, t.url, saved, diag)


@_checked
async def abench(
    url: str | None = None,
    *,
    concurrency: StrictInt | Sequence[StrictInt] | None = None,
    deployment: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    num_gpus: int | None = None,
    warmup: bool | None = None,
    slo: str = "",
    **options: Any,
) -> BenchResult | BenchSweep:
    """:func:`bench` as a coroutine: ``await m3ctl.abench(...)`` inside a running event loop (Jupyter, an async
    service). Same arguments, result and errors; the blocking steps (endpoint check, tokenizer, prompts,
    ``/metrics``) run in worker threads and the load generator on the caller's loop
    (m3ctl.loadgen.runner.arun_bench). Cancelling the task ends the run early with the partial result
    (``interrupted``, invalid)."""
    checked = await asyncio.to_thread(
        settings.check, url, deployment, model, concurrency, api_key, num_gpus, warmup, options, slo
    )
    return await runner.arun(checked)
