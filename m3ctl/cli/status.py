"""``m3ctl status``: the deployments m3ctl started, with their phase, endpoint and uptime."""

import typer

from m3ctl.cli import options as o
from m3ctl.cli.output import Output, escape
from m3ctl.cli.render import print_smoke


def status(json_out: o.Json = False) -> None:
    """List the deployments m3ctl started, with their phase, endpoint and uptime."""
    from m3ctl import serve as serving  # noqa: PLC0415

    out = Output(json_out)
    rows = serving.status()
    bad = serving.unreadable()
    out.result([{**r.deployment.model_dump(), "alive": r.alive, "phase": r.phase, "uptime_s": r.uptime_s}
                for r in rows] + [{"name": n, "phase": "unreadable", "path": path} for n, path in bad.items()])
    if out.json:
        return
    if not rows and not bad:
        typer.echo("no deployments")
        return
    from rich.table import Table  # noqa: PLC0415

    t = Table()
    t.add_column("name", overflow="fold")
    t.add_column("phase", no_wrap=True)
    t.add_column("endpoint", no_wrap=True)  # never cut: it is what a client needs
    t.add_column("model", overflow="fold")
    t.add_column("runtime / pid / image / plan", overflow="fold")
    t.add_column("uptime", no_wrap=True)
    t.add_column("smoke", overflow="fold")
    for r in rows:
        d = r.deployment
        where = (d.container_id or "")[:12] if d.runtime == "docker" else str(d.pid or "")
        restarts = f" ({d.restarts} restarts)" if d.restarts else ""
        probs = [f["status"] for f in d.smoke or [] if f["status"] in ("WARN", "FAIL")]
        smoke = "-" if d.smoke is None else (", ".join(f"{n} {s}" for s, n in sorted(
            {s: probs.count(s) for s in probs}.items())) if probs else "ok")
        t.add_row(escape(d.name), r.phase, d.url, escape(d.served_model_name),
                  escape(f"{d.runtime} {where} {d.image or '-'} / {d.plan_hash or '-'}"),
                  f"{r.uptime_s:.0f} s{restarts}", smoke)
    for n, path in bad.items():
        t.add_row(escape(n), "unreadable", "?", escape(path), "-", "-", "-")
    out.con.print(t)
    for r in rows:
        if any(f["status"] in ("WARN", "FAIL") for f in r.deployment.smoke or []):
            out.print(f"{r.deployment.name}:")
            print_smoke(out.con, r.deployment.smoke, only_problems=True)
