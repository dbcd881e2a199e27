"""``m3ctl status``: the deployments m3ctl started, with their phase, endpoint and uptime."""

import typer

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.output import Output, escape, hang
from m3ctl.cli.render import print_smoke


def status(json_out: o.Json = False) -> None:
    """List the deployments m3ctl started, with their phase, endpoint and uptime."""

    out = Output(json_out)
    st = api.status()
    rows, bad = st.deployments, st.unreadable
    out.result(st.to_json())
    if out.json:
        return
    if not rows and not bad:
        typer.echo("no deployments")
        return
    width = out.con.width
    for r in rows:  # a head line (name, phase, endpoint: never cut), then the details wrapped under it
        d = r.deployment
        where = f"container {(d.container_id or '')[:12]}" if d.runtime == "docker" else f"pid {d.pid or '-'}"
        restarts = f" ({d.restarts} restarts)" if d.restarts else ""
        probs = [f["status"] for f in d.smoke or [] if f["status"] in ("WARN", "FAIL", "UNJUDGED")]  # never "ok"
        smoke = (
            "-"
            if d.smoke is None
            else (
                ", ".join(f"{n} {s}" for s, n in sorted({s: probs.count(s) for s in probs}.items())) if probs else "ok"
            )
        )
        unwatched = "  unwatched" if r.unwatched else ""
        out.con.print(
            escape(f"{d.name}  {r.phase}{unwatched}  {d.url}  up {r.uptime_s:.0f} s{restarts}"), soft_wrap=True
        )
        out.con.print(
            escape(
                hang(
                    "  ",
                    f"model {d.served_model_name}; {d.runtime} {where}; image {d.image or '-'}; "
                    f"plan {d.plan_hash or '-'}; smoke {smoke}",
                    width,
                )
            ),
            soft_wrap=True,
        )
        if d.fallbacks:  # serve --fallback auto: each launch, the remedy it was followed by or why none
            steps = "; ".join(
                f"{a['attempt']} {a['outcome']}"
                + (f" ({a['family']})" if a.get("family") else "")
                + (f" -> {a['remedy']}" if a.get("remedy") else "")
                + (f": not relaunched: {a['not_retried']}" if a.get("not_retried") else "")
                for a in d.fallbacks
            )
            out.con.print(escape(hang("  ", f"fallback attempts: {steps}", width)), soft_wrap=True)
        if r.engine.dead:  # when, how and why; the record stays for `m3ctl logs` until `m3ctl stop`
            out.con.print(
                escape(
                    hang(
                        "  ",
                        f"{r.engine.sentence()}; log {d.log_path or '-'}; `m3ctl stop {d.name}` removes the record",
                        width,
                    )
                ),
                soft_wrap=True,
            )
            if r.engine.fix:
                out.con.print(escape(hang("  ", f"try: {r.engine.fix}", width)), soft_wrap=True)
        elif r.unwatched:  # its foreground serve (or launch, or tune) was killed: no watchdog, no restart
            why = f"unwatched: the m3ctl process that watched it (pid {d.supervisor_pid}) is gone; {r.hint}"
            out.con.print(escape(hang("  ", why, width)), soft_wrap=True)
        elif r.phase in ("paused", "unknown"):
            out.con.print(escape(hang("  ", r.engine.detail, width)), soft_wrap=True)
    for n, path in bad.items():
        out.con.print(escape(f"{n}  unreadable  {path}"), soft_wrap=True)
    for r in rows:
        if any(f["status"] in ("WARN", "FAIL", "UNJUDGED") for f in r.deployment.smoke or []):
            out.print(f"{r.deployment.name}:")
            print_smoke(out.con, r.deployment.smoke, only_problems=True)
