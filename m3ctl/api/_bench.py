"""The API of ``m3ctl bench``: sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

from m3ctl.api._args import _checked
from m3ctl.errors import BadInput

if TYPE_CHECKING:
    from pydantic import StrictInt

    from m3ctl.loadgen.runner import BenchConfig
    from m3ctl.results import BenchResult, BenchSweep


# ----------------------------------------------------------------------------- bench
def _bench_config(
    url: str | None,
    deployment: str | None,
    model: str | None,
    concurrency: int | Sequence[int] | None,
    api_key: str | None,
    num_gpus: int | None,
    warmup: bool | None,
    options: dict[str, Any],
    slo: str = "",
    on_note: Callable[[str], None] | None = None,
) -> tuple[BenchConfig, list[int | None], Any, dict[str, list[int] | None]]:
    """(config, concurrency levels, sync_log, length lists) of a bench call; the levels are [] or [c] for a single
    run; the length lists ``{"input_lens", "output_lens"}`` are None unless ``input_len`` / ``output_len`` were
    given as sequences (a length sweep). ``slo``: the capacity rule's SLO of a concurrency sweep (checked here)."""
    from pydantic import ValidationError  # noqa: PLC0415

    from m3ctl.loadgen.runner import BenchConfig, validate  # noqa: PLC0415
    from m3ctl.loadgen.target import resolve_target  # noqa: PLC0415

    if unknown := sorted(set(options) - set(BenchConfig.model_fields)):
        import difflib  # noqa: PLC0415

        close = difflib.get_close_matches(unknown[0], list(BenchConfig.model_fields), n=1)
        raise BadInput(
            f"unknown bench option {unknown[0]!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
            "see m3ctl.loadgen.runner.BenchConfig for the options and their units",
        )
    levels: list[int | None] = [concurrency] if isinstance(concurrency, int) else list(concurrency or [])
    if any(not isinstance(c, int) or c < 1 for c in levels):
        raise BadInput(f"bad concurrency {concurrency!r}: values must be integers >= 1", "e.g. concurrency=[1, 2, 4]")
    lens: dict[str, list[int] | None] = {"input_lens": None, "output_lens": None}
    for key in ("input_len", "output_len"):
        if isinstance(options.get(key), list | tuple):
            from m3ctl.loadgen.sweep import check_lengths  # noqa: PLC0415

            vals = list(options.pop(key))
            if not vals:
                raise BadInput(f"bad {key} {vals!r}: give at least one length", f"e.g. {key}=[512, 4096]")
            check_lengths(key, vals)
            lens[f"{key}s"], options[key] = vals, vals[0]
    if options.get("trace_path") and any(len(v or ()) > 1 for v in lens.values()):
        raise BadInput(
            "a trace gives each request's lengths: input_len / output_len lists do not apply",
            "drop the length lists or trace_path",
        )
    if slo and slo.strip():
        from m3ctl.loadgen.slo import parse_slo  # noqa: PLC0415

        parse_slo(slo)
        if len(levels) < 2:
            raise BadInput(
                "slo decides the capacity of a sweep: give concurrency several levels",
                'e.g. concurrency=[8, 16, 32], slo="p90_tpot_ms<=30"',
            )
    # The options are checked before anything is sent: the model id is asked of the server afterwards.
    t = resolve_target(url, deployment=deployment, model=model, num_gpus=num_gpus, api_key=api_key, lookup_model=False)
    try:
        sweep = len(levels) > 1 or any(len(v or ()) > 1 for v in lens.values())
        cfg = BenchConfig(
            url=t.url,
            model=t.model or "?",
            concurrency=levels[0] if levels else None,
            warmup=sweep if warmup is None else warmup,
            model_dir=t.model_dir,
            server_log=t.server_log,
            num_gpus=t.num_gpus,
            num_gpus_source=t.num_gpus_source,
            api_key=t.api_key,
            auth_basic=t.basic_auth,
            deployment=t.deployment,
            **{"deployment_gpus": t.gpus, **options},
        )
    except ValidationError as e:
        err = e.errors()[0]
        raise BadInput(
            f"bad bench option {'.'.join(map(str, err['loc']))}: {err['msg']}", "see m3ctl.loadgen.runner.BenchConfig"
        ) from None
    except TypeError as e:
        raise BadInput(f"bad bench option: {e}", "see m3ctl.loadgen.runner.BenchConfig") from None
    validate(cfg)
    if not t.model:  # several served names: the deployment's model, else the first listed (logged)
        picked, note = t.pick_model()
        cfg = cfg.model_copy(update={"model": picked})
        if note and on_note is not None:
            on_note(note)
        elif note:
            import logging  # noqa: PLC0415

            logging.getLogger("m3ctl.bench").info(note)
    return cfg, levels, t.sync_log, lens


def _bench_plan(cfg: BenchConfig, levels: list[int | None], lens: dict[str, list[int] | None]) -> list:
    """The sweep levels of a bench call (m3ctl.loadgen.sweep.plan); one level: a single run."""
    from m3ctl.loadgen.sweep import plan  # noqa: PLC0415

    return plan(lens["input_lens"] or [cfg.input_len], lens["output_lens"] or [cfg.output_len], levels or [None])


def _bench_result(runs: list[dict], plan: list, slo: str = "") -> BenchResult | BenchSweep:
    from m3ctl.loadgen.report import sweep_doc  # noqa: PLC0415
    from m3ctl.loadgen.sweep import axes  # noqa: PLC0415
    from m3ctl.results import BenchResult, BenchSweep  # noqa: PLC0415

    if len(plan) > 1:
        return BenchSweep.model_validate(
            {**sweep_doc(runs, *axes(plan), slo=slo), "runs": [BenchResult.from_dict(r) for r in runs]}
        )
    return BenchResult.from_dict(runs[0])


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
    import contextlib  # noqa: PLC0415

    from m3ctl.loadgen.runner import run_bench, run_sweep  # noqa: PLC0415

    cfg, levels, sync_log, lens = _bench_config(
        url, deployment, model, concurrency, api_key, num_gpus, warmup, options, slo, on_note
    )
    plan = _bench_plan(cfg, levels, lens)
    if len(plan) > 1:
        runs = run_sweep(cfg, levels, progress=progress, sync_log=sync_log, **lens)
    else:
        with progress(cfg) if progress is not None else contextlib.nullcontext(None) as prog:
            runs = [run_bench(cfg, progress=prog, sync_log=sync_log)]
    return _bench_result(runs, plan, slo)


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
    from m3ctl.loadgen.runner import run_failure  # noqa: PLC0415
    from m3ctl.loadgen.target import resolve_target  # noqa: PLC0415

    runs = [r.to_dict() for r in result.runs] if hasattr(result, "runs") else [result.to_dict()]
    t = resolve_target(url, deployment=deployment, lookup_model=False)
    diag = None
    if t.server_log and any(r.get("server_down") for r in runs):  # name the root cause from the log (N09)
        from m3ctl.serving.diagnose import DiagContext, diagnose_log  # noqa: PLC0415

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
    from m3ctl.loadgen.runner import arun_bench, arun_sweep  # noqa: PLC0415

    cfg, levels, sync_log, lens = await asyncio.to_thread(
        _bench_config, url, deployment, model, concurrency, api_key, num_gpus, warmup, options, slo
    )
    plan = _bench_plan(cfg, levels, lens)
    runs = (
        await arun_sweep(cfg, levels, sync_log=sync_log, **lens)
        if len(plan) > 1
        else [await arun_bench(cfg, sync_log=sync_log)]
    )
    return _bench_result(runs, plan, slo)
