"""``m3ctl plan --estimate``'s view: the figures of :func:`m3ctl.api.estimate` as ranges, with what dominates them."""

from __future__ import annotations

from typing import Any

from m3ctl.cli.output import Output, escape

#: (field, label, decimals) of each figure, in the order shown.
_ROWS = (
    ("tok_s_user", "decode tok/s per user", 0),
    ("tok_s_gpu", "total tok/s per GPU", 0),
    ("tpot_ms", "TPOT (ms)", 1),
    ("prefill_s", "prefill of one prompt (s)", 3),
    ("tokens_per_dollar", "total tokens per USD", 0),
)


def number(x: float, decimals: int = 0) -> str:
    """``x`` with thousands separators and ``decimals`` places, or two significant digits where those places would
    show fewer (0.18 tok/s per user at a long context reads 0.18, not 0)."""
    text = f"{x:,.{decimals}f}"
    if x and len(text.replace(",", "").replace(".", "").lstrip("-0")) < 2:
        return f"{x:#.2g}"
    return text


def users(e: Any) -> str:
    """The users of an estimate and their split over its replicas (``10 users (2+2+1+1+1+1+1+1 per replica)``)."""
    split = e.users_per_replica
    per = f" ({'+'.join(map(str, split))} per replica)" if len(split) > 1 else ""
    return f"{e.concurrency:,} user{'s' if e.concurrency > 1 else ''}{per}"


def show_estimate(out: Output, e: Any) -> None:
    """The estimate as a table (low, mid, high) under one line naming the layout and workload, then the dominant
    assumption (of tok/s per GPU), each figure's own where another dominates it, and every input it rests on;
    ``--json``: the whole estimate."""
    out.result(e.model_dump())
    if out.json:
        return
    from rich.table import Table  # noqa: PLC0415 - rich's table only when a table is drawn

    layout = (
        f"TP{e.tp}"
        + (f" PP{e.pp}" if e.pp > 1 else "")
        + (" EP" if e.ep else "")
        + (f" DCP{e.dcp}" if e.dcp > 1 else "")
    )
    t = Table(
        title=f"m3ctl plan --estimate: {layout} on {e.gpu}, {e.dp} replica{'s' if e.dp > 1 else ''} of "
        f"{e.tp * e.pp} GPUs ({e.gpus} in all), {users(e)}, {e.input_len:,} in / {e.output_len:,} out "
        "(an estimate before anything runs)"
    )
    for col in ("figure", "low", "mid", "high"):
        t.add_column(col, no_wrap=True, justify="left" if col == "figure" else "right")
    for key, label, places in _ROWS:
        fig = getattr(e, key)
        if fig is not None:
            t.add_row(label, number(fig.low, places), number(fig.mid, places), number(fig.high, places))
        elif key in ("tok_s_user", "tpot_ms"):  # one output token: no decode step to price
            t.add_row(label, "n/a", "n/a", "n/a")
    out.con.print(t)
    for f in e.findings:
        out.con.print(f"[yellow]warning:[/] {escape(f)}", soft_wrap=True)
    out.con.print(f"dominant assumption: {escape(e.dominant)}")
    labels = {key: label for key, label, _ in _ROWS}
    for key, named in e.dominant_by_figure.items():
        if named.split(":")[0] != e.dominant.split(":")[0] and key in labels:  # another assumption dominates it
            out.con.print(f"  {labels[key]}: {escape(named)}", soft_wrap=True)
    out.con.print("what it rests on:")
    for a in e.assumptions:
        out.con.print(f"  {escape(a)}", soft_wrap=True)
