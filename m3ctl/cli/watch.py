"""``m3ctl watch``: liveness of a running deployment (a real 1-token completion and /metrics); exit 4 on failure.

With ``--json``: JSON Lines, one object per watchdog event (``probe``, ``restart``...).
"""

import time
from typing import Annotated

import typer

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.output import Output, escape


def probe_printer(out: Output, name: str):
    """The watchdog's events as one line each (or JSON Lines)."""

    def show(e) -> None:
        if e.kind == "probe" and e.probe is not None:
            p = e.probe
            waiting = p.metrics.get("vllm:num_requests_waiting")
            out.event("probe", name=name, ok=p.ok, verdict=p.verdict, detail=p.detail, requests_waiting=waiting)
            mark = "[green]ok[/]" if p.ok else f"[red]{p.verdict}[/]"
            extra = f"  waiting {waiting:.0f}" if waiting is not None else ""
            out.print(f"  watch {time.strftime('%H:%M:%S')} {mark} {escape(p.detail)}{extra}")
        else:
            out.event(e.kind, name=name, detail=e.detail)
            out.print(f"  watch {e.kind} {escape(e.detail)}")

    return show


def watch(
    name: Annotated[str, typer.Argument(help="Deployment name.")],
    interval: Annotated[float, typer.Option(min=0, help="Seconds between probes.")] = 10.0,
    canary_timeout: Annotated[
        float,
        typer.Option(
            parser=o.positive_float, metavar="SECONDS", help="Seconds the 1-token canary completion may take."
        ),
    ] = 30.0,
    stall: Annotated[float, typer.Option(min=0, help="Seconds requests may wait with no token generated.")] = 60.0,
    restart: Annotated[
        str,
        typer.Option(parser=o.choice("no", "on-failure"), help="no or on-failure (stop and relaunch the saved plan)."),
    ] = "no",
    max_restarts: Annotated[int, typer.Option(min=0, help="Restarts before giving up.")] = 3,
    count: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many probes (default: until a failure).")
    ] = None,
    json_out: o.Json = False,
) -> None:
    """Watch a running deployment: liveness with a real 1-token completion and /metrics; exit 4 on failure."""

    out = Output(json_out)
    try:
        with api.signal_policy():  # SIGTERM/SIGHUP end the watch as Ctrl-C does: exit 128 + the signal
            api.watch(
                name,
                interval_s=interval,
                canary_timeout_s=canary_timeout,
                stall_s=stall,
                restart=restart,
                max_restarts=max_restarts,
                count=count,
                on_start=lambda dep: out.print(
                    f"watching {name} at {dep.url} every {interval:g} s (restart {restart})"
                ),
                on_event=probe_printer(out, name),
            )
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: the deployment keeps running (unless a relaunch was cut)
        running = api.running(name)
        out.event("interrupted", name=name, running=running)
        out.print(
            f"stopped watching; {name} keeps running"
            if running
            else f"stopped watching; {name} is not running (an interrupted relaunch stops its server)"
        )
        raise typer.Exit(api.interrupt_exit_code(e)) from None
