"""``m3ctl bench report``: compare bench results side by side; the human renderings of bench results."""

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from m3ctl.cli import bench_options as bo
from m3ctl.cli import options as o
from m3ctl.cli.inputs import check_outputs
from m3ctl.cli.output import Output, console, print_hang
from m3ctl.loadgen import pareto, report


def bench_report(
    files: Annotated[list[Path], typer.Argument(help="Result JSON files (single runs or sweeps).")],
    output_csv: bo.OutputCsv = None,
    plot: bo.Plot = None,
    plot_x: bo.PlotX = "inferencex-median",
    json_out: o.Json = False,
) -> None:
    """Compare bench results side by side (and optionally write CSV / a Pareto chart)."""
    out = Output(json_out)
    check_outputs(new_dirs=False, output_csv=output_csv, plot=plot)
    runs = report.load_runs(files)
    rows = report.compare_table(runs)
    out.result({"runs": len(runs), "rows": [{"metric": r[0], "values": r[1:]} for r in rows]})
    if not out.json:
        print_compare(runs)
    if output_csv:
        report.write_csv(runs, output_csv)
    if plot:
        png = pareto.pareto_png(runs, plot, plot_x)
        out.print(f"Pareto chart: {png}")


def print_compare(runs: list[dict]) -> None:
    """The runs side by side, split into several tables when the console is too narrow (no number cut)."""
    con = console()
    for r in report.compare_renderables(runs):
        con.print(r)


def print_bench(res: dict, pcts: list[float]) -> None:
    con = console()
    tables, notes = report.bench_tables(res, pcts)
    for t in tables:
        con.print(t)
    for n in notes:  # wrapped at word boundaries (never inside a number), no trailing spaces in a log file
        plain = Text.from_markup(n).plain
        warn = plain.startswith("warning:")
        print_hang(con, "", plain, 0, "yellow" if warn else None, (0, 8) if warn else None)
