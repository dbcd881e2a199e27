"""The tuning search space: restart knobs, their default ranges from the profile and the inventory,
user pins/narrowing, and the mapping of one candidate to :func:`m3ctl.planning.plan.plan` keyword arguments.

Every knob is a restart knob (changing it needs a new server); concurrency is the in-server load
knob and is bisected per configuration (:mod:`m3ctl.tuning.search`). Default ranges follow
the outer (restart) knobs of docs/sources.md#tune-algorithm; a knob whose feature the
profile does not support (``supports.dcp``/``dbo``/``ep``, ``spec_methods``) is pinned off, and the
planning rules (m3ctl/assess/rules.py) reject any remaining illegal combination before launch.
"""

from __future__ import annotations

import difflib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from m3ctl.assess.request import PlanRequest
from m3ctl.catalog import Profile
from m3ctl.errors import BadInput

#: Knob name -> plan() keyword. Order is the display order.
KNOBS = ("tp", "dp", "dcp", "ep", "dbo", "spec_depth", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype")
#: Knob -> vllm serve flag it sets (m3ctl/data/vllm_serve_flags.yaml, vLLM 0.32.0).
FLAGS = {
    "tp": "tensor-parallel-size",
    "dp": "data-parallel-size",
    "dcp": "decode-context-parallel-size",
    "ep": "enable-expert-parallel",
    "dbo": "enable-dbo",
    "max_num_seqs": "max-num-seqs",
    "max_num_batched_tokens": "max-num-batched-tokens",
    "kv_cache_dtype": "kv-cache-dtype",
    "spec_depth": "speculative-config",
}
#: kv_cache_dtype value meaning "leave the profile's choice" (optuna categoricals cannot hold None).
DEFAULT = "default"


@dataclass
class Space:
    """Candidate values per knob (a single value = pinned)."""

    values: dict[str, list[Any]]
    spec_method: str | None = None
    pinned_by_user: set[str] = field(default_factory=set)

    def grid(self) -> list[dict[str, Any]]:
        """Every combination (the grid a brute-force search would run), in a stable order."""
        keys = list(self.values)
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(self.values[k] for k in keys))]

    def size(self) -> int:
        n = 1
        for v in self.values.values():
            n *= len(v)
        return n

    def anchor(self) -> dict[str, Any]:
        """The first configuration to measure (docs/sources.md#tune-algorithm: start from a reference so the
        search is never worse than it): speculation off, the largest batch limits and TP in range (vLLM's own
        defaults are at or above them: max-num-seqs 256, max-num-batched-tokens 8192 on GPUs), the first value
        of every other knob (``kv_cache_dtype``: the plan's own). A DSpark drafter searched at its trained block size
        (:func:`default_space`: depths 0 and that size) starts on: the day-0 stack runs it, so the search starts from
        the day-0 plan and speculation off is its first neighbour."""
        out = {}
        for k, v in self.values.items():
            if k == "spec_depth":
                day0_drafter = self.spec_method == "dspark" and len(v) == 2 and min(v) == 0
                out[k] = max(v) if day0_drafter else min(v)
            elif k in ("max_num_seqs", "max_num_batched_tokens", "tp"):
                out[k] = max(v)
            else:
                out[k] = v[0]
        return out

    def free(self) -> list[str]:
        return [k for k, v in self.values.items() if len(v) > 1]

    def to_json(self) -> dict:
        return {"values": self.values, "spec_method": self.spec_method, "pinned_by_user": sorted(self.pinned_by_user)}

    @classmethod
    def from_json(cls, d: dict) -> Space:
        return cls(
            values={k: list(v) for k, v in d["values"].items()},
            spec_method=d.get("spec_method"),
            pinned_by_user=set(d.get("pinned_by_user", [])),
        )


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= max(1, n):
        out.append(v)
        v *= 2
    return out


def default_space(
    profile: Profile,
    n_gpus: int,
    *,
    moe: bool = False,
    attention: str = "gqa",
    drafter_method: str | None = None,
    max_spec_depth: int = 4,
    drafter_block_size: int | None = None,
) -> Space:
    """Default ranges for a host with ``n_gpus`` GPUs (0 = CPU) under ``profile``.

    A DSpark drafter is searched at 0 and its trained ``drafter_block_size`` only (other depths are rejected or
    collapse acceptance: rule spec.dspark_depth). Batching ranges: CPU hosts {2,4,8,16} sequences x {256,512,2048} tokens (the tiny-model regime,
    docs/sources.md#measured-on-the-projects-cpu-machine); GPU hosts {64,128,256,512} x {2048,8192,16384} around vLLM's
    defaults (``vllm serve --help``: max-num-seqs 256 on GPUs, max-num-batched-tokens 8192 for the
    OpenAI server; https://docs.vllm.ai/en/v0.32.0/cli/serve/).
    """
    sup = profile.supports
    tps = _pow2_upto(n_gpus) if n_gpus > 1 else [1]
    dcps = [d for d in _pow2_upto(max(tps)) if d <= 8] if sup.dcp and attention in sup.dcp_attention else [1]
    method = (
        drafter_method if drafter_method in sup.spec_methods else ("ngram" if "ngram" in sup.spec_methods else None)
    )
    depths = list(range(max_spec_depth + 1)) if method else [0]
    if method == "dspark" and drafter_block_size:  # DSpark runs only at its trained block size (rule spec.dspark_depth)
        depths = [0, drafter_block_size]
    gpu = n_gpus > 0
    kv = profile.kv_cache_dtypes.get(attention, ["auto"])
    return Space(
        values={
            "tp": tps,
            "dp": [1],
            "dcp": dcps,
            "ep": [False, True] if (moe and sup.ep and n_gpus > 1) else [False],
            "dbo": [False, True] if (sup.dbo and moe and n_gpus > 1) else [False],
            "spec_depth": depths,
            "max_num_seqs": [64, 128, 256, 512] if gpu else [2, 4, 8, 16],
            "max_num_batched_tokens": [2048, 8192, 16384] if gpu else [256, 512, 2048],
            "kv_cache_dtype": [DEFAULT] + [k for k in kv if k != "auto"] if len(kv) > 1 and gpu else [DEFAULT],
        },
        spec_method=method,
    )


def _coerce(knob: str, text: str) -> Any:
    t = text.strip()
    if knob in ("ep", "dbo"):
        if t.lower() in ("1", "true", "on", "yes"):
            return True
        if t.lower() in ("0", "false", "off", "no"):
            return False
        raise BadInput(f"bad value {t!r} for knob {knob}", f"use {knob}=on, {knob}=off or {knob}=on,off")
    if knob == "kv_cache_dtype":
        return DEFAULT if t in ("", "auto", DEFAULT) else t
    try:
        v = int(t)
    except ValueError:
        raise BadInput(f"bad value {t!r} for knob {knob}: not an integer", f"e.g. --knob {knob}=4,8,16") from None

    try:  # the knob's domain is its PlanRequest field's (tp >= 1, spec_depth >= 0, ...): checked in one place
        PlanRequest.model_validate({knob: v})
    except ValidationError as e:
        raise BadInput(
            f"bad value {t!r} for knob {knob}: {e.errors()[0]['msg']}", f"e.g. --knob {knob}=4,8,16"
        ) from None
    return v


def apply_pins(space: Space, specs: list[str]) -> Space:
    """Narrow or pin knobs: ``["max_num_seqs=4,8", "spec_depth=0-4", "tp=8"]`` (``A-B`` = integer range).

    Raises:
        BadInput: unknown knob (did-you-mean), bad value, an empty range, or one knob given twice (the second
            would silently replace the first).
    """
    vals = {k: list(v) for k, v in space.values.items()}
    pinned = set(space.pinned_by_user)
    given: dict[str, str] = {}
    for spec in specs:
        key, eq, rhs = spec.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not rhs.strip():
            raise BadInput(f"bad --knob {spec!r}", "use KNOB=V1,V2 or KNOB=LO-HI, e.g. --knob spec_depth=0-4")
        if key not in KNOBS:
            close = difflib.get_close_matches(key, KNOBS, n=1)
            raise BadInput(
                f"unknown knob {key!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                f"knobs: {', '.join(KNOBS)}",
            )
        if key in given:
            both = ",".join(dict.fromkeys([*given[key].split(","), *rhs.split(",")]))
            raise BadInput(
                f"--knob {key} given twice ({given[key]} and {rhs})", f"give its values once: --knob {key}={both}"
            )
        given[key] = rhs
        out: list[Any] = []
        for part in rhs.split(","):
            part = part.strip()
            lo, dash, hi = part.partition("-")
            if dash and lo.isdigit() and hi.isdigit():
                if int(hi) < int(lo):
                    raise BadInput(f"empty range {part!r} for knob {key}", f"e.g. --knob {key}={hi}-{lo}")
                out += list(range(int(lo), int(hi) + 1))
            else:
                out.append(_coerce(key, part))
        vals[key] = list(dict.fromkeys(out))
        pinned.add(key)
    return Space(values=vals, spec_method=space.spec_method, pinned_by_user=pinned)


def prune_dominated(space: Space, ladder: list[int]) -> tuple[Space, list[str]]:
    """Drop knob values that cannot change a measurement on this ladder (analytic pruning before launch,
    docs/sources.md#tune-algorithm: max-num-seqs is set to just cover the chosen C).

    max-num-seqs caps the requests the scheduler runs at once (vLLM ``--max-num-seqs``: "Maximum number of
    sequences to be processed in a single iteration", https://docs.vllm.ai/en/v0.32.0/cli/serve/); a bench run
    at concurrency C never has more than C requests in flight (each request is one sequence; speculative
    tokens count against max-num-batched-tokens, not sequences). So every value at or above the largest
    ladder concurrency behaves like the smallest such value; only that one is kept. A knob the user pinned
    or narrowed (``--knob``) is left alone. Returns the pruned space and one note per pruning.
    """
    notes: list[str] = []
    vals = dict(space.values)
    seqs = vals.get("max_num_seqs", [])
    if "max_num_seqs" not in space.pinned_by_user and ladder and len(seqs) > 1:
        cmax = max(ladder)
        cover = sorted(v for v in seqs if v >= cmax)
        if len(cover) > 1:
            vals["max_num_seqs"] = [v for v in seqs if v < cmax or v == cover[0]]
            notes.append(
                f"max_num_seqs {', '.join(map(str, cover[1:]))} dropped: at most {cmax} requests are in flight "
                f"(the ladder's largest concurrency), so they run like max_num_seqs {cover[0]}"
            )
    return Space(values=vals, spec_method=space.spec_method, pinned_by_user=set(space.pinned_by_user)), notes


def plan_kwargs(cand: dict[str, Any], spec_method: str | None) -> dict[str, Any]:
    """plan() keyword arguments for one candidate."""
    kw: dict[str, Any] = {k: v for k, v in cand.items() if k in KNOBS}
    if kw.get("kv_cache_dtype") == DEFAULT:
        kw["kv_cache_dtype"] = None
    if kw.get("spec_depth"):
        kw["spec_method"] = spec_method
    return kw


def key_of(cand: dict[str, Any]) -> str:
    """Stable identity of a candidate (for de-duplication across resumes)."""
    return json.dumps({k: cand[k] for k in sorted(cand)}, sort_keys=True)


def describe(cand: dict[str, Any], space: Space | None = None, layout: dict[str, int] | None = None) -> str:
    """Short text of the knobs that vary (all knobs without a space). ``layout``: the planned server's ``tp``, ``pp``
    and ``dp`` (m3ctl.tuning.plans.TrialPlans.layout), which name the layout that runs where the planner changed
    the requested one: ``tp=1`` planned with pipeline parallelism 8 so the weights fit reads ``tp=1 pp=8 gpus=8``
    (GPUs: TP x PP x DP), a different server from ``tp=8`` (layers split into stages, not each layer's weights)."""
    keys = space.free() if space is not None else list(cand)
    words = _words(cand, keys)
    if layout and (layout.get("pp", 1) > 1 or ("tp" in cand and layout.get("tp", cand["tp"]) != cand["tp"])):
        tp, pp, dp = layout.get("tp", 1), layout.get("pp", 1), layout.get("dp", 1)
        planned = f"tp={tp} pp={pp} gpus={tp * pp * dp}"
        words = [planned if w.startswith("tp=") else w for w in words]
        if planned not in words:
            words.insert(0, planned)
    return " ".join(words) or "(all pinned)"


def _words(cand: dict[str, Any], keys: list[str]) -> list[str]:
    short = {
        "tp": "tp",
        "dp": "dp",
        "dcp": "dcp",
        "ep": "ep",
        "dbo": "dbo",
        "spec_depth": "k",
        "max_num_seqs": "seqs",
        "max_num_batched_tokens": "mbt",
        "kv_cache_dtype": "kv",
    }
    return [f"{short.get(k, k)}={cand[k]}" for k in keys]
