"""The options bench and ``bench report`` share: result files and the Pareto figure's axis."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from m3ctl.cli.options import choice, completes
from m3ctl.loadgen.pareto import X_AXES


@completes(lambda: X_AXES)
def plot_axis(text: str) -> str:
    """A Pareto x axis of m3ctl.loadgen.pareto.X_AXES."""
    return choice(*X_AXES)(text)


OutputCsv = Annotated[
    Path | None, typer.Option(help="Write one CSV row per run here (checked writable before any work).")
]
Plot = Annotated[
    Path | None,
    typer.Option(help="Pareto PNG of the runs: tok/s per GPU vs tok/s per user (checked writable before any work)."),
]
PlotX = Annotated[
    str, typer.Option(parser=plot_axis, help="Pareto x axis: inferencex-median, agentx-p90 or aiperf-median.")
]
