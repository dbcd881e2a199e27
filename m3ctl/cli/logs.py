"""``m3ctl logs``: a deployment's server log (``--json``: the lines as a JSON list; with -f, JSON Lines)."""

from typing import Annotated

import typer

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.output import Output


def logs(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("-n", min=0, help="Lines from the end (0: all).")] = 100,
    json_out: o.Json = False,
) -> None:
    """Print a deployment's server log."""

    out = Output(json_out)
    log = api.logs(name, lines=lines)
    tail = log.lines
    if out.json and follow:
        for line in tail:
            out.event("line", name=name, text=line)
    elif out.json:
        out.result({"name": name, "log_path": log.log_path, "lines": tail})
    else:
        typer.echo("\n".join(tail))
    if follow:
        try:
            for chunk in log.follow():
                if out.json:
                    for line in chunk.splitlines():
                        out.event("line", name=name, text=line)
                else:
                    typer.echo(chunk, nl=False)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
