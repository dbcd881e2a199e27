"""m3ctl's offline estimate (``plan --estimate``) against the figures vLLM's day-0 post gives for MiniMax-M3.1-Flash:
per figure, the estimate's range for the closest workload m3ctl can pose, the published figure's position in it
(published / estimate mid) and why they differ. No GPU: the estimate is the catalog's peaks x assumed efficiencies
(m3ctl.planning.estimate), not yet fitted on a GPU.

    python benchmarks/estimate_vs_published.py            # prints the markdown table of docs/results/estimate-vs-published.md

The published figures and what they measure (AgentX "E2E-normalized interactivity" or 1000/TPOT, total tokens
counting cached prefix input, tokens per dollar at a TCO tier the post does not name) are read per
docs/bench.md (metric definitions); the post does not name its workload or concurrency, so each row states the workload posed.
"""

from __future__ import annotations

from dataclasses import dataclass

from m3ctl import api


@dataclass(frozen=True)
class Published:
    """One published figure and the workload m3ctl poses for it. ``figure``: ``tok_s_user``, ``tok_s_gpu`` or
    ``tokens_per_dollar``; ``price``: USD per GPU-hour for tokens per dollar (the SemiAnalysis TCO tiers);
    ``prefix_hit``: the fraction of each prompt the prefix cache serves (``plan --estimate --prefix-cache-hit``)."""

    system: str
    figure: str
    value: float
    claim: str
    concurrency: int
    input_len: int
    output_len: int
    spec_depth: int = 0
    price: float | None = None
    prefix_hit: float = 0.0
    why: str = ""


#: The day-0 post's figures as the issue that asked for this comparison quotes them. Workloads: the post names
#: none; "up to ... per user" is the latency end (c=1, 8K in / 1K out); the totals are AgentX figures, posed as an
#: agentic turn (64K-token prompt, 95 % of it a cached prefix, 1K out) with each figure's row saying so, and as
#: the plain 8K / 1K throughput end (c=256) for contrast.
FIGURES = (
    Published(
        "gb300x4",
        "tok_s_user",
        418.9,
        "up to 418.9 tok/s per user (GB300)",
        1,
        8192,
        1024,
        spec_depth=7,
        why="speculation dominates: the estimate assumes any acceptance length from 1 to 8 for the DSpark drafter",
    ),
    Published(
        "rubinx8",
        "tok_s_user",
        724.9,
        "up to 724.9 tok/s per user (Rubin)",
        1,
        8192,
        1024,
        spec_depth=7,
        why="as GB300; Rubin's peaks are partly assumed in the catalog (gpu_peaks.yaml says which)",
    ),
    Published(
        "rubinx8",
        "tok_s_gpu",
        191_500.0,
        "191.5K total tok/s per GPU (Rubin)",
        256,
        8192,
        1024,
        why="not this workload: AgentX total tokens are mostly cached prefix input (next row)",
    ),
    Published(
        "rubinx8",
        "tok_s_gpu",
        191_500.0,
        "191.5K total tok/s per GPU (Rubin)",
        64,
        65536,
        1024,
        spec_depth=7,
        prefix_hit=0.95,
        why="the agentic shape is posed, not published (trace lengths and hit rate assumed); acceptance 1-8 assumed",
    ),
    Published(
        "mi355xx8",
        "tokens_per_dollar",
        133.3e6,
        "133.3M tokens per dollar of TCO (MI355X, AgentX)",
        256,
        8192,
        1024,
        price=1.48,
        why="not this workload (cached-prefix counting, next row); at the hyperscaler tier ($1.48/GPU-h)",
    ),
    Published(
        "mi355xx8",
        "tokens_per_dollar",
        133.3e6,
        "133.3M tokens per dollar of TCO (MI355X, AgentX)",
        64,
        65536,
        1024,
        price=1.48,
        prefix_hit=0.95,
        why="agentic shape posed as for Rubin; no DSpark on CDNA4 in the catalog; TCO tier not named by the post",
    ),
)


def rows() -> list[dict]:
    """Each figure with the estimate for its workload: ``low``/``mid``/``high`` of the same figure, ``ratio``
    (published / mid) and ``inside`` (low <= published <= high)."""
    out = []
    for f in FIGURES:
        wl = {
            "concurrency": f.concurrency,
            "input_len": f.input_len,
            "output_len": f.output_len,
            "prefix_cache_hit": f.prefix_hit,
        }
        if f.price is not None:
            wl["usd_per_gpu_hour"] = f.price
        e = api.estimate(system=f.system, workload=wl, spec_depth=f.spec_depth)
        fig = getattr(e, f.figure)
        out.append(
            {
                "published": f,
                "plan": f"TP{e.tp}{' EP' if e.ep else ''} x{e.gpus} {e.gpu}",
                "low": fig.low,
                "mid": fig.mid,
                "high": fig.high,
                "ratio": f.value / fig.mid,
                "inside": fig.low <= f.value <= fig.high,
                "dominant": e.dominant,
            }
        )
    return out


def _n(x: float) -> str:
    return f"{x / 1e6:,.1f}M" if x >= 1e6 else f"{x:,.0f}"


def table(rs: list[dict]) -> str:
    """The markdown table of docs/results/estimate-vs-published.md."""
    head = (
        "| published | workload posed | plan | estimate low / mid / high | published / mid | inside | why |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    body = ""
    for r in rs:
        f: Published = r["published"]
        wl = (
            f"c={f.concurrency}, {f.input_len:,} in / {f.output_len:,} out"
            + (f", DSpark depth {f.spec_depth}" if f.spec_depth else "")
            + (f", {f.prefix_hit:.0%} prefix cache hit" if f.prefix_hit else "")
        )
        body += (
            f"| {f.claim} | {wl} | {r['plan']} | {_n(r['low'])} / {_n(r['mid'])} / {_n(r['high'])} "
            f"| {r['ratio']:.2f}x | {'yes' if r['inside'] else 'no'} | {f.why} |\n"
        )
    return head + body


if __name__ == "__main__":
    print(table(rows()), end="")
