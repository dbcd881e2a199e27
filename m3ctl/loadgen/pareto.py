"""The Pareto chart of bench runs, after InferenceX (https://github.com/SemiAnalysisAI/InferenceX-app/blob/main/docs/d3-charts.md,
docs/sources.md#benchmark-metric-definitions): y = total tok/s per GPU, x = tok/s per user (:data:`X_AXES`), frontier =
points not dominated on both. Runs are drawn by validity class (:func:`validity_class`, :data:`RUN_STYLES`), in the
tune's chart too; each point carries its 95 % interval as error bars where the run has one.
"""

from __future__ import annotations

import io
from pathlib import Path

from m3ctl.core.files import write_atomic
from m3ctl.errors import BadInput
from m3ctl.loadgen.validity import run_verdict


def _ix(r: dict, block: str, stat: str) -> float | None:
    """``interactivity.<block>.<stat>`` of a run; None when absent or not measured (a vLLM file, TPOT in bursts)."""
    return ((r.get("interactivity") or {}).get(block) or {}).get(stat)


X_AXES = {
    "inferencex-median": (
        "tok/s per user = 1000 / median TPOT (InferenceX)",
        lambda r: _ix(r, "inferencex_1000_over_tpot", "median"),
    ),
    "agentx-p90": (
        "tok/s per user = 1 / P90(E2EL_i / OSL_i) (AgentX)",
        lambda r: _ix(r, "agentx_e2e_normalized", "p90"),
    ),
    "aiperf-median": ("tok/s per user = median of 1 / TPOT_i (AIPerf)", lambda r: _ix(r, "aiperf_per_user", "median")),
}


def rate_text(rate) -> str:
    """A result's ``request_rate`` for a table: ``"inf"``/None as they are, a number to 3 significant digits (a
    replayed trace's mean rate is e.g. 7.333333 req/s)."""
    return f"{rate:.3g}" if isinstance(rate, int | float) else str(rate)


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


#: Validity classes of a run, in legend order (:func:`validity_class`).
VALIDITY_CLASSES = ("clean", "warnings", "invalid", "unchecked")
#: How a Pareto chart draws each class: (legend label, matplotlib ``scatter`` keywords). Clean: filled circle;
#: with warnings (or unmeasured metrics): hollow circle; BENCH-INVALID: grey cross; no m3ctl verdict: hollow
#: grey square.
RUN_STYLES: dict[str, tuple[str, dict]] = {
    "clean": ("valid", {"marker": "o", "facecolors": "tab:blue", "edgecolors": "tab:blue"}),
    "warnings": (
        "valid, with warnings",
        {"marker": "o", "facecolors": "none", "edgecolors": "tab:orange", "linewidths": 1.5},
    ),
    "invalid": ("BENCH-INVALID", {"marker": "x", "c": "0.6"}),
    "unchecked": (
        "no validity verdict (could not judge, or not an m3ctl run)",
        {"marker": "s", "facecolors": "none", "edgecolors": "0.4"},
    ),
}


def validity_class(res: dict) -> str:
    """A run's validity class from its result dict (its ``validity`` block, m3ctl.loadgen.validity._validity):
    ``invalid`` when ``validity.valid`` is False or nothing completed; ``warnings`` when valid with
    ``validity.warnings`` or metrics it did not measure (``validity.unmeasured`` / ``unmeasured``);
    ``clean`` when valid without either; ``unchecked`` without a ``validity`` block (a ``vllm bench serve``
    file: m3ctl checked nothing) or when the run could not be judged (m3ctl.loadgen.validity.run_verdict)."""
    v = res.get("validity")
    if not isinstance(v, dict):
        return "invalid" if res.get("completed") == 0 else "unchecked"
    severity = run_verdict(v).severity
    if res.get("completed") == 0 or severity == "fatal":
        return "invalid"
    if severity == "unjudged":  # never drawn as a pass, nor as BENCH-INVALID
        return "unchecked"
    if not v.get("valid", True):
        return "invalid"
    return "warnings" if v.get("warnings") or v.get("unmeasured") or res.get("unmeasured") else "clean"


def scatter_by_validity(ax, xs: list[float], ys: list[float], classes: list[str], **kw) -> None:
    """Scatter the points on ``ax``, one collection per validity class present (style and legend label from
    :data:`RUN_STYLES`, ``gid`` = the class name); ``kw`` go to every ``scatter`` (e.g. ``s``, ``zorder``)."""
    for cls in VALIDITY_CLASSES:
        idx = [i for i, c in enumerate(classes) if c == cls]
        if idx:
            label, style = RUN_STYLES[cls]
            ax.scatter([xs[i] for i in idx], [ys[i] for i in idx], label=label, gid=cls, **style, **kw)


def pareto_png(runs: list[dict], path: Path, x_axis: str = "inferencex-median", title: str | None = None) -> Path:
    """Plot tok/s per GPU vs tok/s per user for the runs (labelled by concurrency or rate) to a PNG, written
    atomically (m3ctl.core.files.write_atomic).

    Raises:
        BadInput: unknown ``x_axis`` or no run with the metric.
        m3ctl.core.files.WriteFailed: the file could not be written (nothing partial is left).
    """
    write_atomic(path, pareto_png_bytes(runs, x_axis, title))
    return path


def pareto_png_bytes(runs: list[dict], x_axis: str = "inferencex-median", title: str | None = None) -> bytes:
    """The PNG of :func:`pareto_png`, in memory.

    Raises:
        BadInput: unknown ``x_axis`` or no run with the metric.
    """
    fig = pareto_figure(runs, x_axis, title)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def pareto_figure(runs: list[dict], x_axis: str = "inferencex-median", title: str | None = None):
    """The matplotlib Figure of :func:`pareto_png` (the caller closes it): every run with the x metric, drawn by
    :func:`validity_class` (a legend entry per class present); the frontier is drawn over the valid runs only
    (a BENCH-INVALID run is shown, never on the frontier). A run whose TPOT was not measured (streamed in
    bursts: ``unmeasured``) has no TPOT-based x and is left out of those axes.

    Raises:
        BadInput: unknown ``x_axis`` or no run with the metric.
    """
    if x_axis not in X_AXES:
        raise BadInput(f"unknown x axis {x_axis!r}", f"use one of {', '.join(X_AXES)}")
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    xlabel, get = X_AXES[x_axis]
    pts, labels, classes, ylabel = [], [], [], ""
    for r in runs:
        x = get(r)
        if x is None:
            continue
        y, ylabel = y_value(r)
        pts.append((x, y))
        classes.append(validity_class(r))
        c = r.get("max_concurrency")
        labels.append(f"c={c}" if c else f"{rate_text(r.get('request_rate'))} req/s")
    if not pts:
        raise BadInput(
            "no run has the metrics for a Pareto chart",
            "runs need output lengths above 1 token and a measured TPOT (not streamed in bursts), "
            "or use --plot-x agentx-p90",
        )
    ok = [i for i, c in enumerate(classes) if c != "invalid"]
    front = [ok[j] for j in pareto_front([pts[i] for i in ok])]
    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    scatter_by_validity(ax, [p[0] for p in pts], [p[1] for p in pts], classes, zorder=3)
    bars = [error_bars(r, x_axis, p) for r, p in zip([r for r in runs if get(r) is not None], pts, strict=True)]
    if any(b != (0.0, 0.0, 0.0, 0.0) for b in bars):
        ax.errorbar(
            [p[0] for p in pts],
            [p[1] for p in pts],
            xerr=[[b[0] for b in bars], [b[1] for b in bars]],
            yerr=[[b[2] for b in bars], [b[3] for b in bars]],
            fmt="none",
            ecolor="0.55",
            elinewidth=1,
            capsize=2,
            zorder=1,
            label="95 % interval (uncertainty)",
        )
    if front:
        ax.plot(
            [pts[i][0] for i in front],
            [pts[i][1] for i in front],
            "-",
            color="tab:blue",
            label="Pareto frontier (valid runs)",
            zorder=2,
        )
    for (x, y), lab in zip(pts, labels, strict=True):
        ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    model = runs[0].get("model_id", "")
    ax.set_title(title or f"m3ctl bench: {model}")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def error_bars(r: dict, x_axis: str, pt: tuple[float, float]) -> tuple[float, float, float, float]:
    """A run's error bars on the Pareto chart at ``pt``, ``(x below, x above, y below, y above)``, from its
    ``uncertainty`` figures: y scaled by total throughput's relative interval (batch means of the steady state);
    x, on the InferenceX axis (1000 / median TPOT), from the median TPOT's interval. 0 where there is none."""
    figs = (r.get("uncertainty") or {}).get("figures") or {}
    y = figs.get("total_token_throughput") or {}
    rel = y.get("rel_half_width") or 0.0
    xb = (0.0, 0.0)
    t = figs.get("median_tpot_ms") or {}
    if x_axis == "inferencex-median" and t.get("ci95") and min(t["ci95"]) > 0:
        lo, hi = 1000 / t["ci95"][1], 1000 / t["ci95"][0]
        xb = (max(0.0, pt[0] - lo), max(0.0, hi - pt[0]))
    return (*xb, pt[1] * rel, pt[1] * rel)
