"""SLO and objective parsing.

An SLO is a comma-separated list of ``KEY OP VALUE`` terms over keys of the bench result JSON
(m3ctl/loadgen/runner.py, vLLM's key names: ``p90_tpot_ms``, ``p99_ttft_ms``, ``mean_e2el_ms``...),
e.g. ``p90_tpot_ms<=20,p90_ttft_ms<=2000``. Latency keys are in milliseconds; ``OP`` is one of
``<=``, ``<``, ``>=``, ``>``.

A term whose metric the run did not measure (null in the result: TPOT/ITL of a run streamed in bursts, whose
``unmeasured`` block says why, m3ctl.loadgen.metrics.unmeasured; or a key the result lacks) never passes: it
fails (:meth:`Term.ok` False, :meth:`Term.violation` 1.0) and :meth:`Term.unmeasured` says why.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from dataclasses import dataclass

from m3ctl.errors import BadInput

_LAT = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
#: Non-latency result keys an SLO may also bound (``>=``-style floors).
OTHER_KEYS = (
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "request_goodput",
    "p90_interactivity_tok_s_user",
    "median_interactivity_tok_s_user",
)
_SUGGEST = [
    f"{s}_{m}_ms" for s in ("mean", "median", "p50", "p90", "p95", "p99") for m in ("ttft", "tpot", "itl", "e2el")
]
_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt}

#: Objectives: name -> (description, unit).
OBJECTIVES = {
    "tput_per_gpu": "total (input + output) tokens/s per GPU",
    "output_tput_per_gpu": "output tokens/s per GPU",
    "tokens_per_usd": "total tokens per USD (needs --usd-per-gpu-hour)",
}


@dataclass(frozen=True)
class Term:
    key: str
    op: str
    value: float

    def ok(self, res: dict) -> bool:
        """Whether the result meets the term; False when its metric was not measured (:meth:`unmeasured`)."""
        v = metric(res, self.key)
        return v is not None and _OPS[self.op](v, self.value)

    def unmeasured(self, res: dict) -> str | None:
        """Why the result has no value for this term's metric (None when it has one): the reason the result's
        ``unmeasured`` block gives for the metric (e.g. ``"bursts: ..."``), else ``"null in the result"`` or
        ``"not in the result"``."""
        if metric(res, self.key) is not None:
            return None
        why = res.get("unmeasured") or {}
        src = self.key  # the result key the value comes from
        if self.key.endswith("_interactivity_tok_s_user"):
            src = f"{self.key.split('_')[0]}_tpot_ms"
        m = _LAT.match(src)
        stem = m.group(2) if m else src  # the metric's name in ``unmeasured``: tpot, itl, request_goodput...
        if isinstance(why, dict) and why.get(stem):
            return str(why[stem])
        return "null in the result" if src in res else "not in the result"

    def violation(self, res: dict) -> float:
        """Relative violation (> 0 when broken, <= 0 when met); 1.0 when the metric is missing or unmeasured."""
        v = metric(res, self.key)
        if v is None:
            return 1.0
        scale = abs(self.value) or 1.0
        return (v - self.value) / scale if self.op in ("<=", "<") else (self.value - v) / scale

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value:g}"


@dataclass(frozen=True)
class SLO:
    terms: tuple[Term, ...]

    def ok(self, res: dict) -> bool:
        return all(t.ok(res) for t in self.terms)

    def violation(self, res: dict) -> float:
        return max((t.violation(res) for t in self.terms), default=-1.0)

    def unmeasured(self, res: dict) -> list[tuple[Term, str]]:
        """The terms whose metric the result did not measure, each with why (:meth:`Term.unmeasured`)."""
        return [(t, why) for t in self.terms if (why := t.unmeasured(res)) is not None]

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.terms) or "none"


def metric(res: dict, key: str) -> float | None:
    """A numeric value of a bench result (flat vLLM key, or a derived interactivity key)."""
    if key.endswith("_interactivity_tok_s_user"):
        tpot = res.get(f"{key.split('_')[0]}_tpot_ms")
        return 1000.0 / tpot if tpot else None
    v = res.get(key)
    return float(v) if isinstance(v, int | float) else None


def parse_slo(text: str | None) -> SLO:
    """Parse ``"p90_tpot_ms<=20,p90_ttft_ms<=2000"``.

    Raises:
        BadInput: a term without an operator, an unknown key (with a did-you-mean), a percentile outside
            (0, 100], a value that is not a finite number >= 0, a latency limit of 0, a lower bound on a latency
            (``p90_tpot_ms>=3``),
            one metric given twice, or a text with no term at all (``","``).
    """
    if not text or not text.strip():
        return SLO(())
    terms: list[Term] = []
    for raw in text.split(","):
        part = raw.strip().replace(" ", "")
        if not part:
            continue
        m = re.match(r"^([A-Za-z0-9_.]+)(<=|>=|<|>|==?)(.+)$", part)
        if not m:
            raise BadInput(
                f"bad SLO term {raw.strip()!r}: expected KEY<=VALUE", 'e.g. --slo "p90_tpot_ms<=20,p90_ttft_ms<=2000"'
            )
        key, op, val = m.groups()
        if op.startswith("="):
            raise BadInput(f"bad SLO operator {op!r} in {part!r}", "use <=, <, >= or >")
        if not (_LAT.match(key) or key in OTHER_KEYS):
            close = difflib.get_close_matches(key, _SUGGEST + list(OTHER_KEYS), n=1)
            raise BadInput(
                f"unknown SLO metric {key!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                "use a bench result key such as p90_tpot_ms, p99_ttft_ms, mean_e2el_ms (milliseconds)",
            )
        if key.startswith("p") and _LAT.match(key) and not 0 < float(key[1:].split("_")[0]) <= 100:
            raise BadInput(
                f"bad SLO metric {key!r}: a percentile is above 0 and at most 100",
                "e.g. p90_tpot_ms, p99_ttft_ms, p99.9_e2el_ms",
            )
        try:
            value = float(val)
        except ValueError:
            raise BadInput(f"bad SLO value {val!r} in {part!r}: not a number", "e.g. p90_tpot_ms<=20") from None
        if not math.isfinite(value) or value < 0:
            raise BadInput(
                f"bad SLO value {val!r} in {part!r}: latencies, rates and counts are finite and >= 0",
                "e.g. p90_tpot_ms<=20",
            )
        if _LAT.match(key) and value == 0:
            raise BadInput(
                f"bad SLO term {part!r}: no request takes 0 ms, so this limit can never hold", f"e.g. {key}<=20"
            )
        if _LAT.match(key) and op.startswith(">"):
            raise BadInput(
                f"bad SLO term {part!r}: a latency SLO is an upper bound (lower is better)",
                f"e.g. {key}<={val}",
            )
        if any(t.key == key for t in terms):
            raise BadInput(f"SLO metric {key!r} given twice in {text.strip()!r}", "give each metric one limit")
        terms.append(Term(key, op, value))
    if not terms:
        raise BadInput(f"--slo {text.strip()!r} has no term", 'e.g. --slo "p90_tpot_ms<=20" (or leave --slo out)')
    return SLO(tuple(terms))


def objective_value(res: dict, objective: str, n_gpus: int, usd_per_gpu_hour: float | None) -> float:
    """The objective of one bench result. Per GPU = throughput / GPUs of the deployment (TP x PP x DP, 1 on CPU),
    as InferenceX utils/process_result.py; tokens per USD = tok/s/GPU x 3600 / ($/GPU-h)."""
    n = max(1, n_gpus)
    if objective == "tput_per_gpu":
        return float(res["total_token_throughput"]) / n
    if objective == "output_tput_per_gpu":
        return float(res["output_throughput"]) / n
    if objective == "tokens_per_usd":
        if not usd_per_gpu_hour:
            raise BadInput("objective tokens_per_usd needs a price", "pass --usd-per-gpu-hour")
        return float(res["total_token_throughput"]) / n * 3600 / usd_per_gpu_hour
    close = difflib.get_close_matches(objective, list(OBJECTIVES), n=1)
    raise BadInput(
        f"unknown objective {objective!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
        f"use one of {', '.join(OBJECTIVES)}",
    )
