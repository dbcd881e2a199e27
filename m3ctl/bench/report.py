"""Result files: JSON (single run or sweep), CSV, side-by-side comparison, Pareto chart.

A sweep file is ``{"m3ctl_schema_version": ..., "sweep": {"axis": "concurrency", "values": [...]},
"runs": [<run result>, ...]}``; a single run is one result dict (a superset of ``vllm bench serve``
``--save-result``). The Pareto chart follows InferenceX (shared/reference/anchors-bench-tune.md
section 4.2): y = total tok/s per GPU, x = tok/s per user, frontier = points not dominated on both.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from m3ctl.errors import BadInput

# x-axis choices: name -> (label, getter)
X_AXES = {
    "inferencex-median": ("tok/s per user = 1000 / median TPOT (InferenceX)",
                          lambda r: (r["interactivity"].get("inferencex_1000_over_tpot") or {}).get("median")),
    "agentx-p90": ("tok/s per user = 1 / P90(E2EL_i / OSL_i) (AgentX)",
                   lambda r: (r["interactivity"].get("agentx_e2e_normalized") or {}).get("p90")),
    "aiperf-median": ("tok/s per user = median of 1 / TPOT_i (AIPerf)",
                      lambda r: (r["interactivity"].get("aiperf_per_user") or {}).get("median")),
}


def load_runs(paths: list[Path]) -> list[dict]:
    """All runs in the given result files (single runs and sweeps).

    Raises:
        BadInput: a file is missing or is not an m3ctl / vllm result.
    """
    runs = []
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
        except FileNotFoundError:
            raise BadInput(f"result file {p} not found", "pass files written by --output-json") from None
        except json.JSONDecodeError as e:
            raise BadInput(f"{p} is not JSON: {e.msg}", "pass files written by --output-json") from None
        items = data.get("runs", [data]) if isinstance(data, dict) else []
        if not items or not all(isinstance(r, dict) and "completed" in r for r in items):
            raise BadInput(f"{p} is not a bench result", "pass files written by `m3ctl bench --output-json`")
        for r in items:
            r.setdefault("_file", str(p))
        runs += items
    return runs


def sweep_doc(runs: list[dict], axis: str, values: list) -> dict:
    from m3ctl.bench.runner import SCHEMA_VERSION  # noqa: PLC0415

    return {"m3ctl_schema_version": SCHEMA_VERSION, "sweep": {"axis": axis, "values": values}, "runs": runs}


def flat(r: dict) -> dict:
    """Scalar keys, nested blocks flattened with ``.`` (for CSV); per-request arrays dropped."""
    out: dict = {}

    def walk(prefix: str, v) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else k, x)
        elif not isinstance(v, list):
            out[prefix] = v

    walk("", {k: v for k, v in r.items() if not k.startswith("_")})
    return out


def write_csv(runs: list[dict], path: Path) -> None:
    """One row per run, the union of flattened keys as columns."""
    rows = [flat(r) for r in runs]
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def y_value(r: dict) -> tuple[float, str]:
    """Total tok/s per GPU when the GPU count is known, else total tok/s of the endpoint."""
    pg = r.get("per_gpu")
    if pg:
        return pg["tput_per_gpu"], "total tok/s per GPU"
    return r["total_token_throughput"], "total tok/s (endpoint; GPU count not given)"


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points not dominated when maximising both coordinates, sorted by x."""
    idx = []
    for i, (x, y) in enumerate(points):
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i):
            idx.append(i)
    return sorted(idx, key=lambda i: points[i][0])


def pareto_png(runs: list[dict], path: Path, x_axis: str = "inferencex-median", title: str | None = None) -> Path:
    """Plot tok/s per GPU vs tok/s per user for the runs (labelled by concurrency or rate) to a PNG.

    Raises:
        BadInput: unknown ``x_axis`` or no run with the metric.
    """
    if x_axis not in X_AXES:
        raise BadInput(f"unknown x axis {x_axis!r}", f"use one of {', '.join(X_AXES)}")
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    xlabel, get = X_AXES[x_axis]
    pts, labels, ylabel = [], [], ""
    for r in runs:
        x = get(r)
        if x is None:
            continue
        y, ylabel = y_value(r)
        pts.append((x, y))
        c = r.get("max_concurrency")
        labels.append(f"c={c}" if c else f"{r.get('request_rate')} req/s")
    if not pts:
        raise BadInput("no run has the metrics for a Pareto chart", "runs need output lengths above 1 token")
    front = pareto_front(pts)
    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], color="tab:gray", label="runs", zorder=2)
    ax.plot([pts[i][0] for i in front], [pts[i][1] for i in front], "-o", color="tab:blue", label="Pareto frontier",
            zorder=3)
    for (x, y), lab in zip(pts, labels, strict=True):
        ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    model = runs[0].get("model_id", "")
    ax.set_title(title or f"m3ctl bench: {model}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


COMPARE_ROWS = [
    ("file", lambda r: Path(r.get("_file", "")).name),
    ("label", lambda r: r.get("label")),
    ("concurrency / rate", lambda r: f"{r.get('max_concurrency')} / {r.get('request_rate')}"),
    ("completed / failed", lambda r: f"{r['completed']} / {r['failed']}"),
    ("valid", lambda r: (r.get("validity") or {}).get("valid")),
    ("output tok/s", lambda r: r["output_throughput"]),
    ("total tok/s", lambda r: r["total_token_throughput"]),
    ("total tok/s per GPU", lambda r: (r.get("per_gpu") or {}).get("tput_per_gpu")),
    ("median TTFT ms", lambda r: r.get("median_ttft_ms")),
    ("median TPOT ms", lambda r: r.get("median_tpot_ms")),
    ("p99 ITL ms (per chunk)", lambda r: r.get("p99_itl_ms")),
    ("p99 ITL ms (per token)", lambda r: (r.get("per_token_itl") or {}).get("p99_ms")),
    ("median intvty 1000/TPOT", lambda r: ((r.get("interactivity") or {}).get("inferencex_1000_over_tpot") or {}).get("median")),
    ("p90 e2e-norm intvty", lambda r: ((r.get("interactivity") or {}).get("agentx_e2e_normalized") or {}).get("p90")),
    ("tokens per USD", lambda r: (r.get("cost") or {}).get("total_tokens_per_usd")),
    ("prefix cache hit", lambda r: (r.get("server_metrics") or {}).get("prefix_cache_hit_rate")),
]


def compare_table(runs: list[dict]) -> list[list[str]]:
    """Rows (metric, run1, run2, ...) for a side-by-side comparison."""
    def fmt(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"
        return str(v)

    return [[name] + [fmt(get(r)) for r in runs] for name, get in COMPARE_ROWS]
