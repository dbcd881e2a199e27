"""The layout search: for a model on a host, which parallel layout to launch (plan, serve, doctor, sizing).

The planner (:func:`m3ctl.planning.plan.plan`) calls :func:`search` when a GPU launch leaves any of TP, PP, DP, DCP or
EP open. Each dimension the user gave (``--tp``, ``--ep``, raw ``-- --pipeline-parallel-size 2``, a tuned
profile's ``parallel`` section) is pinned; the search enumerates the rest:

- TP, PP, DP: the sizes of ``capabilities.yaml host.tp_candidates`` whose product (vLLM's world size
  TP x PP x DP, https://github.com/vllm-project/vllm/blob/main/vllm/config/parallel.py) fits the visible GPUs;
- EP on and off for an MoE model on a profile that supports it (off only for a dense model);
- PP > 1 only where the model's architecture implements ``SupportsPP`` in the engine's vLLM, DCP > 1 only where
  the profile supports DCP for the model's attention type (``parallel.pp`` / ``parallel.dcp`` name the others).

Every candidate is planned in full, so every rule of :mod:`m3ctl.assess.rules` judges it (head divisibility,
expert shard alignment, memory per rank, ...); a rejected candidate keeps the rule id that rejected it.

Ranking, best first (documented in docs/plan.md):

1. simpler layouts first: layouts with PP = 1 and DCP = 1 are tried, and PP/DCP layouts only when none of them
   passes (pipeline bubbles and split decode cost latency; they are a way to fit, not a default);
2. fewer rule warnings (a known-good path over a fallback or a known issue);
3. the longer context served (a layout that serves the model's full context over one that caps max-model-len);
4. fewer GPUs idle;
5. the profile's strategy for the GPU count (the tested recipe: ``tp``, ``tep`` or ``dep``);
6. more KV-cache capacity in tokens over all DP replicas;
7. more memory headroom per GPU (budget - weights);
8. then larger TP before DP (enumeration order).

The chosen plan carries the tried layouts (``LaunchPlan.layouts``) with their verdicts; its ``choices`` say why
it won and which were runners-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from m3ctl.assess.capability import table
from m3ctl.assess.choose import Choice
from m3ctl.errors import ConfigRejected


@dataclass(frozen=True)
class Layout:
    """One parallel layout: TP, PP, DP, DCP sizes and EP on/off (GPUs = TP x PP x DP)."""

    tp: int
    pp: int
    dp: int
    dcp: int
    ep: bool

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def label(self) -> str:
        return (
            f"TP {self.tp}"
            + (f" x PP {self.pp}" if self.pp > 1 else "")
            + f" x DP {self.dp}"
            + (" + EP" if self.ep else "")
            + (f" DCP {self.dcp}" if self.dcp > 1 else "")
        )


def _sizes(n: int) -> list[int]:
    return [t for t in table().host.tp_candidates if t <= max(1, n)] or [1]


def candidates(
    n_gpus: int, pins: dict[str, Any], *, moe: bool | None, ep_ok: bool, pp_ok: bool, dcp_sizes: list[int]
) -> list[Layout]:
    """Layouts to try on ``n_gpus`` visible GPUs, in enumeration order (TP descending, then DP, PP, EP as the
    default first). ``pins``: the given dimensions (``tp``, ``pp``, ``dp``, ``dcp``, ``ep``; None = open)."""
    sizes = _sizes(n_gpus)

    def dim(name: str, options: list) -> list:
        return [pins[name]] if pins.get(name) is not None else options

    tps = dim("tp", sorted(sizes, reverse=True))
    pps = dim("pp", sizes if pp_ok else [1])
    dps = dim("dp", sizes)
    dcps = dim("dcp", [1, *dcp_sizes])
    eps = dim("ep", [False, True] if moe is not False and ep_ok else [False])
    out = []
    for tp in tps:
        for dp in dps:
            for pp in pps:
                if tp * pp * dp > max(1, n_gpus) and not all(pins.get(k) is not None for k in ("tp", "pp", "dp")):
                    continue
                for dcp in dcps:
                    if dcp > 1 and tp % dcp:
                        continue
                    for ep in eps:
                        out.append(Layout(tp, pp, dp, dcp, ep))
    if not out:  # the pinned sizes alone exceed the GPUs: the smallest such layout, for parallel.gpus to refuse
        out.append(Layout(tps[-1], pps[0], dps[0], dcps[0], eps[0]))
    return out


@dataclass
class Tried:
    """One layout the search planned: the plan (None when rejected), the rule id and message that rejected it, and
    the rejection itself (``error``: its fix, source and findings; without its traceback, as
    :attr:`m3ctl.planning.outcome.PlanOutcome.error`)."""

    layout: Layout
    plan: Any = None
    rule: str | None = None
    message: str | None = None
    hint: str | None = None
    error: ConfigRejected | None = field(default=None, repr=False, compare=False)

    @property
    def passes(self) -> bool:
        return self.plan is not None

    def verdict(self) -> dict[str, Any]:
        """``{tp, pp, dp, dcp, ep, gpus, verdict, rule, message, kv_tokens, max_model_len}`` (``plan --json``)."""
        fit = self.plan.memory_fit if self.plan is not None else None
        return {
            "tp": self.layout.tp,
            "pp": self.layout.pp,
            "dp": self.layout.dp,
            "dcp": self.layout.dcp,
            "ep": self.layout.ep,
            "gpus": self.layout.gpus,
            "verdict": "passes" if self.passes else "rejected",
            "rule": self.rule,
            "message": self.message,
            "kv_tokens": fit.capacity_tokens() * self.layout.dp if fit else None,
            "max_model_len": fit.context if fit else None,
        }


#: Rules whose verdict depends on the layout; a rejection by any other rule (a flag value, the variant, the image,
#: the block size...) rejects every layout alike, so the search stops at the first candidate and reports it as is.
LAYOUT_RULES = (
    "parallel.",
    "memory.fit",
    "quant.shard_alignment",
    "spec.draft_tp",
    "spec.token_budget",
    "batching.limits",
)


def _layout_dependent(rule_id: str | None) -> bool:
    return rule_id is not None and rule_id.startswith(LAYOUT_RULES)


def _rule_of(e: ConfigRejected) -> tuple[str | None, str]:
    """The rejecting rule's id (None when no rule rejected) and what it found (the whole message then)."""
    return e.rule, e.reason


def _key(t: Tried, n_gpus: int, default: Layout | None, order: int) -> tuple:
    p = t.plan
    fit = p.memory_fit
    warns = sum(1 for w in p.warnings if w.startswith("rule "))
    context = fit.context if fit else 0
    kv = (fit.capacity_tokens() * t.layout.dp) if fit else 0
    headroom = (fit.per_gpu_budget_gib - fit.weights_per_gpu_gib) if fit else 0.0
    return (warns, -context, n_gpus - t.layout.gpus, t.layout != default, -kv, -headroom, order)


def search(
    plan_one: Callable[[Any], Any],
    request: Any,
    *,
    n_gpus: int,
    pins: dict[str, Any],
    moe: bool | None,
    ep_ok: bool,
    pp_ok: bool,
    dcp_sizes: list[int],
    default: Layout | None,
) -> Any:
    """Plan every candidate layout with ``plan_one(request with the layout pinned)`` and return the best plan
    (see the module doc for the ranking), with ``layouts`` (every tried layout's verdict) and a ``layout``
    choice naming the winner and the runners-up.

    Raises:
        ConfigRejected: no layout passes: the rejection of the best-ranked candidate (the profile's default
            layout when it was tried), with the other layouts' rule ids in the hint.
        BadInput: as :func:`m3ctl.planning.plan.plan` (the first candidate raises it: bad input is not layout-specific).
    """
    cands = candidates(n_gpus, pins, moe=moe, ep_ok=ep_ok, pp_ok=pp_ok, dcp_sizes=dcp_sizes)
    simple = [c for c in cands if c.pp == 1 and c.dcp == 1]
    tiers = [simple, [c for c in cands if c not in simple]] if simple else [cands]
    tried: list[Tried] = []
    for tier in tiers:
        for lay in tier:
            req = request.model_copy(update={"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "dcp": lay.dcp, "ep": lay.ep})
            try:
                tried.append(Tried(lay, plan=plan_one(req)))
            except ConfigRejected as e:
                rid, msg = _rule_of(e)
                if not _layout_dependent(rid):
                    raise  # the same for every layout: say it once, in milliseconds
                tried.append(Tried(lay, rule=rid, message=msg, hint=e.hint, error=e.with_traceback(None)))
        if any(t.passes for t in tried):
            break
    order = {t.layout: i for i, t in enumerate(tried)}
    ok = sorted((t for t in tried if t.passes), key=lambda t: _key(t, n_gpus, default, order[t.layout]))
    verdicts = [t.verdict() for t in tried]
    if not ok:
        first = next((t for t in tried if t.layout == default), tried[0])
        others = sorted({t.rule or "rejected" for t in tried if t is not first})
        same = others == [first.rule] or not others
        tail = (
            (
                f"; every one of the {len(tried)} layouts tried on {n_gpus} GPU(s) is rejected"
                + ("" if same else f" (rules: {', '.join(others)})")
            )
            if len(tried) > 1
            else ""
        )
        err = first.error
        raise ConfigRejected(
            f"rule {first.rule}: {first.message}" if first.rule else first.message or "rejected",
            (first.hint or "") + tail,
            rule=first.rule,
            reason=first.message if first.rule else None,
            fix=err.fix if err is not None else None,
            source=err.source if err is not None else None,
            findings=err.findings if err is not None else (),
        )
    best = ok[0]
    p = best.plan
    ups = [t.layout.label() for t in ok[1:4]]
    rejected = [t for t in tried if not t.passes]
    why = [f"best of {len(ok)} passing layout(s) out of {len(tried)} tried"]
    if best.layout == default:
        why.append("the profile's strategy for this GPU count")
    elif default is not None:
        d = next((t for t in tried if t.layout == default), None)
        if d is not None and not d.passes:
            why.append(f"the profile's default {default.label()} is rejected by rule {d.rule}")
    if ups:
        why.append("runners-up: " + ", ".join(ups))
    if rejected:
        why.append(
            "rejected: "
            + "; ".join(sorted({f"{t.layout.label()} ({t.rule})" for t in rejected})[:6])
            + (" ..." if len(rejected) > 6 else "")
        )
    pinned = [k.upper() for k, v in pins.items() if v is not None]
    if pinned:
        why.append(f"{', '.join(pinned)} given")
    choice = Choice(what="parallel", value=best.layout.label(), why="; ".join(why))
    return p.model_copy(
        update={"layouts": verdicts, "choices": [*[c for c in p.choices if c.what != "parallel"], choice]}
    )
