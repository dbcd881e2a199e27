"""``m3ctl stop``: SIGTERM, then SIGKILL after the timeout; verify the port and GPU memory are released."""

import dataclasses
from typing import Annotated

import typer

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.output import Output
from m3ctl.errors import BadInput


def stop(
    name: Annotated[list[str] | None, typer.Argument(help="Deployment name(s).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Stop every deployment.")] = False,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds before SIGKILL.")] = 20.0,
    json_out: o.Json = False,
) -> None:
    """Stop deployments: SIGTERM, then SIGKILL after the timeout; verify nothing is left."""

    if not name and not all_:
        raise BadInput("name a deployment to stop, or pass --all", "see `m3ctl status`")
    out = Output(json_out)
    reports = api.stop(*(name or []), all=all_, timeout_s=timeout)
    out.result([dataclasses.asdict(r) for r in reports])
    if out.json:
        return
    for r in reports:
        how = "was not running" if not r.was_running else ("stopped" if r.graceful else f"killed {r.killed}")
        gpu = (
            "gpu memory n/a (no NVML)"
            if r.gpu_memory_left_mib is None
            else "gpu memory released"
            if not r.gpu_memory_left_mib
            else f"GPU MEMORY HELD {r.gpu_memory_left_mib}"
        )
        typer.echo(f"{r.name}: {how} in {r.seconds:.1f} s; port {'free' if r.port_free else 'STILL BUSY'}; {gpu}")
    if not reports:
        typer.echo("no deployments")
