"""``m3ctl logs``: a deployment's server log (``--json``: the lines as a JSON list; with -f, JSON Lines)."""

from pathlib import Path
from typing import Annotated

import typer

from m3ctl.cli import options as o
from m3ctl.cli.output import Output
from m3ctl.errors import BadInput


def logs(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines.")] = False,
    lines: Annotated[int, typer.Option("-n", min=0, help="Lines from the end (0: all).")] = 100,
    json_out: o.Json = False,
) -> None:
    """Print a deployment's server log."""
    from m3ctl import serve as serving  # noqa: PLC0415
    from m3ctl.state import Deployment, Registry, UnreadableRecord  # noqa: PLC0415

    out = Output(json_out)
    reg = Registry()
    try:
        dep = reg.get(name)
    except UnreadableRecord:  # the log is where every server of that name writes it
        dep = Deployment(name=name, port=0, served_model_name="", model="", log_path=str(reg.logs_dir / f"{name}.log"))
    rt = serving.runtime_for(dep)
    text = rt.log_text(dep, tail_bytes=5_000_000)
    if not text and not Path(dep.log_path or "").is_file():
        raise BadInput(f"no log for {name}", "the deployment has no log yet")
    tail = text.splitlines()[-lines:]  # -n 0: the whole log
    if out.json and follow:
        for line in tail:
            out.event("line", name=name, text=line)
    elif out.json:
        out.result({"name": name, "log_path": dep.log_path, "lines": tail})
    else:
        typer.echo("\n".join(tail))
    if follow:
        try:
            for chunk in rt.follow(dep):
                if out.json:
                    for line in chunk.splitlines():
                        out.event("line", name=name, text=line)
                else:
                    typer.echo(chunk, nl=False)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None
