"""How fast a planned layout serves a workload, before anything runs: decode tok/s per user, total tok/s per GPU,
prefill time and tokens per dollar, each a range with the assumption that dominates it named.

The step cost is m3ctl.assess.cost's; this module runs it at the workload's steady state and at the ends of every
assumed range. Steady state of a closed loop of ``c`` users, ``input_len`` in / ``output_len`` out, speculation
emitting ``al`` tokens per step (acceptance length, 1 without it): a request lives ``n = output_len / al`` steps
after its first token, each verifying ``c x (1 + depth)`` tokens; meanwhile the other ``c - 1`` users' prompts arrive
and are prefilled (``input_len x (1 - hit)`` tokens each; ``hit``: the fraction of each prompt the prefix cache
serves, 0 unless given), one prompt's prefill in one step as chunked prefill schedules a prompt within its token
budget, so ``k = min(n, c - 1)`` of the ``n`` steps carry prefill and the rest are pure decode. Expert coverage is
concave in a step's tokens, so the two kinds of step are priced apart, not as one averaged step. Each sequence attends
``input_len + output_len / 2`` tokens on average (a prefilled token half its prompt: with a cached prefix this
undercounts the attention of the uncached tail, bounded by MSA's selected blocks). Then TPOT = mean step / al, tok/s
per user = 1 / TPOT, a request's latency = the prefill overhead + its prefill step + (output_len - 1) x TPOT, output
tok/s per replica = c x output_len / latency, total (input + output) tok/s per GPU = the replicas' sum x (in + out) /
out / GPUs (every GPU of the plan: TP x PP x DP, idle replicas too); :func:`figures` says how PP and DP enter.
The prefill time of one request is the prefill overhead plus its prefill step alone: the overhead is a fixed cost per
request outside the engine's steps (API server, tokenisation, scheduling the new request, the first step's launch),
so it delays its own request's first token and overlaps the other users' steps (it is not in TPOT).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel

from m3ctl.assess.capability import kv_bytes_per_element
from m3ctl.assess.cost import Eff, Layout, Shape, Step, step_cost, step_seconds
from m3ctl.assess.facts import ModelFacts
from m3ctl.assess.findings import blockers
from m3ctl.assess.peaks import GpuPeak, Input, gpu_peak, peaks
from m3ctl.errors import BadInput
from m3ctl.planning.launchplan import LaunchPlan
from m3ctl.planning.workload import EstimateRequest


class Figure(BaseModel):
    """A range: ``low`` and ``high`` at the ends of the assumptions, ``mid`` at their centres (same unit)."""

    low: float
    mid: float
    high: float


class Estimate(BaseModel):
    """One estimate (units in the names). ``gpus``: every GPU of the plan (``tp x pp x dp``); ``concurrency``: the
    users asked for, ``users_per_replica`` their split over the ``dp`` replicas; ``tpot_ms`` and ``tok_s_user``
    None with one output token (no decode step). ``dominant``: the assumption whose range moves tok/s per GPU most;
    ``dominant_by_figure``: for each figure (``tpot_ms``, ``tok_s_user``, ``tok_s_gpu``, ``prefill_s``) the one that
    moves it most, saying whether that input is measured, fitted or assumed here; ``basis``: that word for each
    input range (the efficiencies, overheads, all-reduce latency, host floor, acceptance length with speculation):
    measured or fitted only on a GPU kind and concurrency the runs covered (m3ctl.assess.peaks.Input), otherwise
    assumed; ``assumptions``: every input that went in, each with its range or value and what it rests on;
    ``findings``: what the server would not run as posed (:func:`findings`), each saying how it is
    modelled."""

    gpu: str
    gpus: int
    tp: int
    ep: bool
    dcp: int
    pp: int = 1
    dp: int = 1
    concurrency: int
    users_per_replica: list[int] = []
    input_len: int
    output_len: int
    prefix_cache_hit: float = 0.0
    tpot_ms: Figure | None
    tok_s_user: Figure | None
    tok_s_gpu: Figure
    prefill_s: Figure
    tokens_per_dollar: Figure | None = None
    dominant: str
    dominant_by_figure: dict[str, str] = {}
    basis: dict[str, Literal["measured", "fitted", "assumed"]] = {}
    assumptions: list[str]
    findings: list[str] = []


@dataclass(frozen=True)
class Workload:
    """``concurrency`` users in a closed loop, ``input_len``/``output_len`` tokens; ``spec_depth`` drafted tokens per
    step with acceptance length ``acceptance`` = (low, high) tokens emitted per step (1, 1 without speculation);
    ``prefix_hit``: the fraction of each prompt read from the prefix cache (not prefilled, still attended);
    ``max_running``: the engine's max-num-seqs per replica (users beyond it queue: not modelled as running)."""

    concurrency: int
    input_len: int
    output_len: int
    spec_depth: int = 0
    acceptance: tuple[float, float] = (1.0, 1.0)
    prefix_hit: float = 0.0
    max_running: int | None = None


def shape_of(facts: ModelFacts, precision: str, kv_bytes: float) -> tuple[Shape, list[str]]:
    """The cost model's shapes from a checkpoint's facts; the MSA geometry from its ``sparse_attention_config`` or
    the table's assumed one (then named in the returned notes).

    Raises:
        BadInput: a fact the estimate needs is unknown (a model m3ctl has no facts for), or an unknown precision.
    """
    need = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size")
    missing = [k for k in need if not getattr(facts, k)]
    if missing:
        raise BadInput(
            f"no estimate for {facts.name or facts.source}: unknown {', '.join(missing)}",
            "give a local checkpoint directory whose config.json states them",
        )
    w = peaks().weights
    if precision not in w.bytes:
        raise BadInput(f"no estimate for precision {precision!r}", f"one of: {', '.join(w.bytes)}")
    notes: list[str] = []
    msa = dict(layers=0, topk_blocks=0, index_heads=0, index_dim=0, block=facts.msa_block_size or 128)
    if facts.attention == "msa":
        cfg = facts.sparse_attention_config or {}
        freq = facts.sparse_attention_freq or [1] * (facts.num_layers or 0)
        msa["layers"] = sum(1 for x in freq[: facts.num_layers] if x)
        if cfg.get("sparse_topk_blocks"):
            msa["topk_blocks"] = int(cfg["sparse_topk_blocks"])
            msa["index_heads"] = int(cfg.get("sparse_num_index_heads") or facts.num_kv_heads or 1)
            msa["index_dim"] = int(cfg.get("sparse_index_dim") or facts.head_dim or 128)
        else:
            a = peaks().msa_assumed
            msa["topk_blocks"], msa["index_heads"], msa["index_dim"] = (
                a.topk_blocks,
                facts.num_kv_heads or 1,
                facts.head_dim or 128,
            )
            if msa["layers"]:  # dense on every layer (--attention dense): no block is selected, nothing to assume
                notes.append(f"MSA geometry: {a.topk_blocks} selected blocks (no sparse_attention_config at hand)")
    expert_b = w.bytes[precision]
    dense_b = 2.0 if precision in w.experts_only else expert_b
    shape = Shape(
        layers=facts.num_layers or 0,
        hidden=facts.hidden_size or 0,
        heads=facts.num_attention_heads or 0,
        kv_heads=facts.num_kv_heads or 0,
        head_dim=facts.head_dim or 0,
        experts=facts.num_experts or 0,
        top_k=facts.experts_per_tok or 0,
        expert_width=facts.moe_intermediate_size or 0,
        vocab=facts.vocab_size or 0,
        dense_bytes=dense_b,
        expert_bytes=expert_b,
        kv_bytes=kv_bytes,
        msa_layers=msa["layers"],
        block=msa["block"],
        topk_blocks=msa["topk_blocks"],
        index_heads=msa["index_heads"],
        index_dim=msa["index_dim"],
    )
    if facts.assumed:
        notes.append(f"model facts {', '.join(facts.assumed)}: the checkpoint's config.json replaces them")
    return shape, notes


@dataclass(frozen=True)
class Steps:
    """The steps of one request's life in the steady state (module docstring): ``pure`` decode steps, ``mixed``
    steps (decode plus other users' prompts), ``k`` of the ``n`` steps mixed, and ``alone``: a prompt's prefill with
    nothing else running (the prefill time of one request)."""

    pure: Step
    mixed: Step
    n: float
    k: int
    alone: Step


def _steps(wl: Workload, al: float) -> Steps:
    """The steady-state steps of ``wl`` for acceptance length ``al``."""
    fresh = max(1, round(wl.input_len * (1.0 - wl.prefix_hit)))  # prompt tokens a request prefills (rest cached)
    decode = wl.concurrency * (1 + wl.spec_depth)
    context = wl.input_len + wl.output_len // 2
    n = max(wl.output_len / al, 1.0)
    others = wl.concurrency - 1
    k = min(int(n), others)
    per = -(-others // k) if k else 0  # prompts per mixed step
    return Steps(
        pure=Step(decode=decode, context=context),
        mixed=Step(decode=decode, prefill=per * fresh, prompts=per, context=context),
        n=n,
        k=k,
        alone=Step(decode=0, prefill=fresh, prompts=1, context=wl.input_len),
    )


#: The assumptions, in the order of a point: (name, unit scale to the model's units).
_NAMES = (
    "HBM efficiency",
    "tensor-core efficiency",
    "step overhead (ms)",
    "prefill overhead (ms)",
    "all-reduce latency (us)",
    "acceptance length",
    "host step floor (ms)",
)

#: For each of :data:`_NAMES`: True where the high end of its range is the fast end (efficiencies, acceptance).
_HIGHER_IS_FASTER = (True, True, False, False, False, True, False)

#: How a figure is named where its dominant assumption is.
_LABELS = {
    "tpot_ms": "TPOT",
    "tok_s_user": "decode tok/s per user",
    "tok_s_gpu": "tok/s per GPU",
    "prefill_s": "the prefill time",
}


def _inputs(wl: Workload) -> list[Input]:
    """The input ranges in :data:`_NAMES` order, each with what it rests on (gpu_peaks.yaml's; the acceptance
    length is the workload's, assumed)."""
    t = peaks()
    e = t.efficiency
    acceptance = Input(
        range=wl.acceptance,
        basis="assumed",
        note="tokens emitted per step with speculation: the drafter's acceptance on this model is not measured",
    )
    comm = t.comm.all_reduce_latency_us
    return [e.hbm, e.compute, e.step_overhead_ms, e.prefill_overhead_ms, comm, acceptance, e.host_floor_ms]


def split(users: int, replicas: int) -> list[int]:
    """``users`` spread over ``replicas`` exactly: the first ``users % replicas`` get one more (some may get 0)."""
    base, extra = divmod(users, max(replicas, 1))
    return [base + 1] * extra + [base] * (max(replicas, 1) - extra)


def figures(shape: Shape, layout: Layout, gpu: GpuPeak, gemm: str, wl: Workload, point: tuple[float, ...]) -> dict:
    """Every figure at one point of the assumptions, ``point`` in :data:`_NAMES` order (ms and us as named).

    ``wl.concurrency`` is the users of all ``layout.dp`` replicas, spread by :func:`split`; TPOT and tok/s per user
    are the busiest replica's users'; tok/s per GPU sums every replica and divides by every GPU (idle ones too).
    With ``pp`` stages a replica keeps ``pp`` micro-batches of ``ceil(c / pp)`` users in flight; a step of one
    passes every stage in turn (``pp`` x a stage's step, each stage holding 1/pp of the layers). The host's
    per-step floor is the engine's, once per step of a micro-batch, not once per stage."""
    hbm, compute, overhead_ms, prefill_ms, latency_us, al, floor_ms = point
    eff = Eff(hbm, compute, overhead_ms / 1e3, latency_us / 1e6)  # the GPU's side; the floor applies to the step

    def secs(step: Step) -> float:
        return max(floor_ms / 1e3, layout.pp * step_seconds(step_cost(shape, layout, step), gpu, gemm, eff))

    def replica(users: int) -> tuple[float, float]:
        """(TPOT in s, output tok/s) of a replica serving ``users``."""
        micro = -(-users // layout.pp)
        st = _steps(replace(wl, concurrency=micro), al)
        mixed = secs(st.mixed) if st.k else 0.0
        tpot = ((st.n - st.k) * secs(st.pure) + st.k * mixed) / st.n / al
        first = mixed if st.k else secs(st.alone)  # a request's own prefill step
        latency = prefill_ms / 1e3 + first + (wl.output_len - 1) * tpot
        return tpot, users * wl.output_len / latency

    running = [min(c, wl.max_running or c) for c in split(wl.concurrency, layout.dp)]
    runs = {c: replica(c) for c in set(running) if c}
    busiest = runs[max(runs)]
    out_tok_s = sum(runs[c][1] for c in running if c)
    return {
        "tpot_ms": busiest[0] * 1e3,
        "tok_s_user": 1.0 / busiest[0],
        "tok_s_gpu": out_tok_s * (wl.input_len + wl.output_len) / max(wl.output_len, 1) / layout.gpus,
        "prefill_s": prefill_ms / 1e3 + secs(_steps(wl, al).alone),
    }


def estimate(
    facts: ModelFacts,
    precision: str,
    kv_bytes: float,
    gpu_name: str,
    layout: Layout,
    wl: Workload,
    usd_per_gpu_hour: float | None = None,
) -> Estimate:
    """The figures of ``wl`` on ``layout`` of ``gpu_name`` GPUs for this checkpoint (module docstring), as ranges.

    Args:
        facts: the checkpoint's facts (m3ctl.assess.facts); precision: the variant's (``nvfp4``, ``fp8``...);
        kv_bytes: bytes per KV element (``--kv-cache-dtype``); gpu_name: as NVML/amdsmi reports it;
        usd_per_gpu_hour: USD per GPU-hour, for tokens per dollar (total tokens).

    Raises:
        BadInput: a GPU the peak table does not know, or facts the estimate needs are unknown.
    """
    found = gpu_peak(gpu_name)
    if found is None:
        raise BadInput(f"no performance data for GPU {gpu_name!r}", "m3ctl/data/gpu_peaks.yaml lists the GPUs it knows")
    key, gpu = found
    t = peaks()
    shape, notes = shape_of(facts, precision, kv_bytes)
    inputs = _inputs(wl)
    ranges = [i.range for i in inputs]
    best = tuple(r[1] if up else r[0] for r, up in zip(ranges, _HIGHER_IS_FASTER, strict=True))
    worst = tuple(r[0] if up else r[1] for r, up in zip(ranges, _HIGHER_IS_FASTER, strict=True))
    mid = tuple((lo + hi) / 2 for lo, hi in ranges)
    gemm = t.weights.gemm[precision]
    f_best, f_mid, f_worst = (figures(shape, layout, gpu, gemm, wl, p) for p in (best, mid, worst))
    swing: dict[str, list[tuple[float, str, int]]] = {k: [] for k in f_mid}  # ties: the later name, as before
    for i, name in enumerate(_NAMES):
        at_lo, at_hi = (tuple(r[j] if k == i else mid[k] for k, r in enumerate(ranges)) for j in (0, 1))
        lo_f, hi_f = (figures(shape, layout, gpu, gemm, wl, p) for p in (at_lo, at_hi))
        for k in f_mid:
            swing[k].append((abs(hi_f[k] - lo_f[k]) / max(abs(f_mid[k]), 1e-12), name, i))
    running = min(split(wl.concurrency, layout.dp)[0], wl.max_running or wl.concurrency)
    step_users = max(-(-running // layout.pp), 1)  # the sequences of the busiest replica's steps

    def named(fig: str) -> str:
        share, _, i = max(swing[fig])
        lo, hi = ranges[i]
        words = inputs[i].standing(key, 1 if fig == "prefill_s" else step_users)[1]  # a prefill alone: one request
        return f"{_NAMES[i]} {lo:g}-{hi:g} ({words}): moves {_LABELS[fig]} by {share * 100:.0f} %"

    dominant_by_figure = {k: named(k) for k in f_mid}
    dominant = dominant_by_figure["tok_s_gpu"]
    ranged = {k: Figure(low=min(f_best[k], f_worst[k]), mid=f_mid[k], high=max(f_best[k], f_worst[k])) for k in f_mid}
    per_dollar = None
    if usd_per_gpu_hour:
        per_dollar = Figure(**{k: v * 3600 / usd_per_gpu_hour for k, v in ranged["tok_s_gpu"].model_dump().items()})
    fig: dict[str, Figure | None] = dict(ranged)
    shown = [i for i, n in enumerate(_NAMES) if n != "acceptance length" or wl.spec_depth]
    here = {i: inputs[i].standing(key, step_users) for i in shown}
    basis = {_NAMES[i]: here[i][0] for i in shown}
    assumptions = [
        f"{_NAMES[i]} {ranges[i][0]:g}-{ranges[i][1]:g}: {here[i][1]}; {inputs[i].note.strip()}" for i in shown
    ]
    if wl.prefix_hit:
        assumptions.append(f"prefix cache hit {wl.prefix_hit:g} of each prompt (given): not prefilled, still attended")
    assumptions += [f"peaks of {key}: {gpu.source}", *(f"{key} {a}" for a in gpu.assumed), *notes]
    if wl.output_len <= 1:  # no decode step: TPOT would be the prefill step's
        fig["tpot_ms"] = fig["tok_s_user"] = None
        dominant_by_figure = {k: v for k, v in dominant_by_figure.items() if k not in ("tpot_ms", "tok_s_user")}
    return Estimate(
        gpu=key,
        gpus=layout.gpus,
        tp=layout.tp,
        ep=layout.ep,
        dcp=layout.dcp,
        pp=layout.pp,
        dp=layout.dp,
        concurrency=wl.concurrency,
        users_per_replica=split(wl.concurrency, layout.dp),
        input_len=wl.input_len,
        output_len=wl.output_len,
        prefix_cache_hit=wl.prefix_hit,
        tokens_per_dollar=per_dollar,
        dominant=dominant,
        dominant_by_figure=dominant_by_figure,
        basis=basis,
        assumptions=assumptions,
        **fig,
    )


def estimate_plan(plan: LaunchPlan, request: EstimateRequest) -> Estimate:
    """:func:`estimate` for what ``plan`` launches: its checkpoint facts, variant precision, KV cache dtype, GPU,
    TP/EP/DCP/PP and speculation depth (acceptance length assumed anywhere from 1 to depth + 1, and named). The
    request's concurrency is spread exactly over the plan's DP replicas (:func:`split`).

    ``findings``: first the plan's fatal findings (a launch planned only because it was asked for, that does not
    serve), then what the server would not run as posed (:func:`findings`).

    Raises:
        BadInput: a plan without its planning context (loaded from JSON: plan it again), a host without GPUs, or as
            :func:`estimate`.
    """
    ctx = plan.rule_context()
    if ctx is None:
        raise BadInput("a saved plan carries no checkpoint facts to estimate from", "run `m3ctl plan --estimate` again")
    if not ctx.inventory.gpus:
        raise BadInput("no GPU to estimate for on this host", "give --system NAME (e.g. h200x8) or --inventory FILE")
    precision = (ctx.variant.precision if ctx.variant else None) or ctx.facts.precision or "bf16"
    facts = ctx.facts
    if next((c.value for c in plan.choices if c.what == "attention"), None) == "dense":  # every layer reads all KV
        facts = facts.model_copy(update={"sparse_attention_freq": [0] * (facts.num_layers or 0)})
    _, depth = ctx.speculation()
    users = Workload(
        concurrency=request.concurrency,
        input_len=request.input_len,
        output_len=request.output_len,
        spec_depth=depth,
        acceptance=(1.0, 1.0 + depth) if depth else (1.0, 1.0),
        prefix_hit=request.prefix_cache_hit,
    )
    seqs = plan.scheduler_limits[1] if plan.scheduler_limits else None
    layout = Layout(tp=ctx.tp, ep=ctx.ep, dcp=ctx.dcp, pp=max(plan.pp, 1), dp=max(ctx.dp, 1))
    users = replace(users, max_running=seqs)
    e = estimate(
        facts,
        precision,
        kv_bytes_per_element(ctx.kv_dtype),
        ctx.inventory.gpus[0].name,
        layout,
        users,
        request.usd_per_gpu_hour,
    )
    fit = plan.memory_fit
    kv, context = (fit.capacity_tokens(), fit.context) if fit else (None, None)
    blocked = [  # planned only because asked (--attention msa into a known fatal issue, --skip-checks)
        f"rule {f.rule} [fatal]: {f.message}: this launch does not serve (priced as if it did)"
        for f in blockers(plan.findings())
    ]
    budget = plan.scheduler_limits[0] if plan.scheduler_limits else None
    return e.model_copy(update={"findings": blocked + findings(users, layout, kv, context, seqs, budget)})


def findings(
    wl: Workload,
    layout: Layout,
    kv_tokens: int | None,
    max_len: int | None,
    seqs: int | None,
    budget: int | None = None,
) -> list[str]:
    """What the server would not run as ``wl`` poses it, each saying how the estimate models it: requests longer
    than ``max_len`` (vLLM refuses them; priced as if accepted), more users per replica than ``seqs``
    (max-num-seqs: the rest queue, modelled as not running) or than ``kv_tokens`` hold (vLLM preempts; modelled as
    if they fit, so optimistic), a prompt's uncached tokens (beside a step's decoding tokens) beyond ``budget``
    (max-num-batched-tokens: vLLM prefills it in chunks over several steps; priced as one step, so optimistic).
    ``kv_tokens``: KV capacity per replica; None where unknown."""
    out: list[str] = []
    length = wl.input_len + wl.output_len
    busiest = split(wl.concurrency, layout.dp)[0]
    if max_len and length > max_len:
        out.append(
            f"input + output = {length:,} tokens exceeds the max model length {max_len:,}: the server refuses "
            "these requests (priced as if it accepted them); lower --input-len/--output-len or raise --max-model-len"
        )
    if seqs and busiest > seqs:
        out.append(
            f"{busiest:,} users on a replica exceed max-num-seqs {seqs:,}: {seqs:,} run and the rest queue (modelled: "
            f"{seqs:,} running per replica; queued users wait, which tok/s per user does not show)"
        )
    if kv_tokens is not None and min(busiest, seqs or busiest) * length > kv_tokens:
        held = kv_tokens // length
        such = f"{held:,} such sequence{'' if held == 1 else 's'}"
        out.append(
            f"{min(busiest, seqs or busiest):,} sequences of {length:,} tokens per replica exceed its KV cache "
            f"({kv_tokens:,} tokens, {such}): vLLM preempts the rest (modelled as if they fit: optimistic)"
        )
    fresh = max(1, round(wl.input_len * (1.0 - wl.prefix_hit)))  # as _steps prefills it
    running = min(busiest, seqs or busiest)
    decoding = -(-running // layout.pp) * (1 + wl.spec_depth) if running > 1 else 0  # beside another's prompt
    if budget and fresh + decoding > budget:
        beside = f" beside {decoding:,} decoding tokens" if decoding else ""
        out.append(
            f"a prompt's {fresh:,} uncached tokens{beside} exceed max-num-batched-tokens {budget:,}: vLLM prefills it "
            "in chunks over several steps (priced as one step: the prefill time and tok/s optimistic); raise "
            "--max-num-batched-tokens or lower --input-len"
        )
    return out
