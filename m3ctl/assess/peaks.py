"""The GPU peaks table, m3ctl/data/gpu_peaks.yaml: per GPU kind its HBM bandwidth, dense tensor-core rates and
link bandwidth with the page each comes from, and the estimate's input ranges (achieved fractions of the peaks,
fixed costs), each with what it rests on (:class:`Input`).

Read by the step cost model (:mod:`m3ctl.assess.cost`, which ``m3ctl plan --estimate`` runs) and by every plan's
day-0 stack (:mod:`m3ctl.assess.dcp`: the context from which indexer DCP pays), which needs the figures and not
the cost model.
"""

import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from m3ctl.catalog import register
from m3ctl.catalog.registry import data


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)  # built on first use


class GpuPeak(_Strict):
    """One GPU kind's peaks: ``hbm_tbps`` (TB/s), dense ``tflops`` per operand precision (bf16, fp8, fp4),
    ``link_gbps`` (GB/s per direction to another GPU of its node), with the page they come from."""

    match: list[str]
    hbm_tbps: float = Field(gt=0)
    tflops: dict[str, float]
    link_gbps: float = Field(gt=0)
    link: str
    source: str
    assumed: list[str] = Field(default_factory=list)


class Input(_Strict):
    """One input range of the estimate and what it rests on. ``basis``: ``measured`` (read off runs, as the host's
    floor is), ``fitted`` (benchmarks/estimate_fit.py's fit to runs) or ``assumed`` (neither: ``note`` says what it
    is and what would confirm it). A measured or fitted one names the GPU kinds (keys of ``gpus``) its runs used, the
    ``hosts`` they ran on where counted, the ``concurrency`` range they covered and the ``runs`` (directories of
    this repository); beyond those (another GPU kind, more users per step) it is an assumption transferred there."""

    range: tuple[float, float]
    basis: Literal["measured", "fitted", "assumed"]
    gpus: list[str] = Field(default_factory=list)
    hosts: int | None = Field(default=None, gt=0)
    concurrency: tuple[int, int] | None = None
    runs: list[str] = Field(default_factory=list)
    note: str

    @model_validator(mode="after")
    def _evidence_matches_basis(self) -> Self:
        if self.range[0] > self.range[1]:
            raise ValueError(f"range {list(self.range)}: low above high")
        evidence = self.gpus or self.runs or self.concurrency or self.hosts
        if self.basis == "assumed" and evidence:
            raise ValueError("an assumed input names no GPUs, hosts, concurrency or runs (its note says why)")
        if self.basis != "assumed" and not (self.gpus and self.runs and self.concurrency):
            raise ValueError(f"a {self.basis} input names the GPU kinds, the concurrency range and the runs")
        return self

    def standing(self, gpu: str, users: int) -> tuple[str, str]:
        """``(basis, words)`` of this input in an estimate for GPU kind ``gpu`` at ``users`` sequences per step:
        measured or fitted only on a GPU kind and within the concurrency its runs covered; elsewhere ``assumed``,
        saying what it was transferred from."""
        if self.basis == "assumed" or not self.concurrency:
            return "assumed", "assumed"
        kinds = " and ".join(self.gpus)
        if self.hosts:
            kinds = f"{'one' if self.hosts == 1 else self.hosts} {kinds} host{'s' if self.hosts > 1 else ''}"
        lo, hi = self.concurrency
        where = f"{self.basis} on {kinds} at c = {lo}" + (f"-{hi}" if hi > lo else "")
        runs = ", ".join(r.rstrip("/").rsplit("/", 1)[-1] for r in self.runs)
        if gpu not in self.gpus:
            return "assumed", f"assumed for {gpu}, transferred from another GPU: {where} only, runs {runs}"
        if not lo <= users <= hi:
            return "assumed", f"assumed at c = {users}: {where} only, runs {runs}"
        return self.basis, f"{where}, runs {runs}"


class Comm(_Strict):
    all_reduce_latency_us: Input


class Efficiency(_Strict):
    """Achieved fractions of the peaks and fixed costs, each a ``[low, high]`` range with its :class:`Input`
    evidence. ``step_overhead_ms``: per engine step, on the GPU's side; ``prefill_overhead_ms``: per request, before
    its first token (m3ctl.planning.estimate prices a prefill as this overhead plus the prefill step's own time);
    ``host_floor_ms``: the host's per-step work, a floor under every step (module docstring)."""

    hbm: Input
    compute: Input
    step_overhead_ms: Input
    prefill_overhead_ms: Input
    host_floor_ms: Input


class Weights(_Strict):
    """Bytes per stored weight by precision; ``experts_only`` precisions; the GEMM rate each runs at."""

    bytes: dict[str, float]
    experts_only: list[str]
    gemm: dict[str, Literal["bf16", "fp8", "fp4"]]


class MsaAssumed(_Strict):
    topk_blocks: int
    index_heads: Literal["kv_heads"]
    index_dim: Literal["head_dim"]


class PeakTable(_Strict):
    schema_version: int
    gpus: dict[str, GpuPeak]
    weights: Weights
    msa_assumed: MsaAssumed
    comm: Comm
    efficiency: Efficiency

    @model_validator(mode="after")
    def _evidence_names_known_gpus(self) -> Self:
        inputs = [self.comm.all_reduce_latency_us, *(getattr(self.efficiency, k) for k in Efficiency.model_fields)]
        unknown = sorted({g for i in inputs for g in i.gpus} - set(self.gpus))
        if unknown:
            raise ValueError(f"evidence names GPU kinds the table does not know: {', '.join(unknown)}")
        return self


register("data/gpu_peaks.yaml", PeakTable)


def peaks() -> PeakTable:
    """m3ctl/data/gpu_peaks.yaml, validated (cached)."""
    return data("data/gpu_peaks.yaml", PeakTable)


#: :func:`gpu_peak`'s answers: GPU name -> (the table answering, its answer); a table read anew answers anew.
_FOUND: dict[str, tuple[PeakTable, tuple[str, GpuPeak] | None]] = {}


def gpu_peak(gpu_name: str) -> tuple[str, GpuPeak] | None:
    """The peaks of the GPU NVML/amdsmi names ``gpu_name`` (``NVIDIA H100 80GB HBM3``): ``(key, peak)``, or None
    for a GPU the table does not know. A ``match`` counts where it starts a word of the name (``H200`` is not in
    ``GH200``, a Grace Hopper with its own HBM and host); the longest wins (``GB300`` over ``B300``), whatever the
    table's order. Matched once per name and table (a plan asks for each layout it tries: ~2 ms of ``m3ctl plan``)."""
    table = peaks()
    known = _FOUND.get(gpu_name)
    if known is not None and known[0] is table:
        return known[1]
    low = gpu_name.lower()
    hits = [
        (len(m), key, g)
        for key, g in table.gpus.items()
        for m in g.match
        if re.search(rf"(?<![a-z0-9]){re.escape(m.lower())}", low)
    ]
    found = None
    if hits:
        _, key, g = max(hits, key=lambda h: h[0])
        found = (key, g)
    _FOUND[gpu_name] = (table, found)
    return found
