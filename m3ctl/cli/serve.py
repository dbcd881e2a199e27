"""``m3ctl serve``: plan, launch, wait until the server really serves, then watch it (or return with --detach).

With ``--json``: ``--dry-run`` prints the plan as one JSON document; a launch prints JSON Lines (one object
per readiness phase, the ready deployment, each watchdog probe, the stop).
"""

from typing import Annotated, Any

import typer
from typer._click.exceptions import MissingParameter  # Typer's click: the error of a missing required option

from m3ctl import api
from m3ctl.cli import options as o
from m3ctl.cli.inputs import given_request
from m3ctl.cli.output import Output, console, escape, print_hang, shell_lines
from m3ctl.cli.render import print_kernels, print_plan, print_smoke
from m3ctl.cli.watch import probe_printer
from m3ctl.errors import BadInput
from m3ctl.serving.settings import ServeSettings
from m3ctl.serving.smoke import planned_checks, smoke_target

#: ``m3ctl serve``'s own options, derived from m3ctl.serving.settings.ServeSettings (declared once, there).
SETTINGS, SETTING_FIELDS = o.declared_options(ServeSettings, {"smoke_choice": o.choice("quick", "full", "off")})


@o.options(o.PLAN_KNOBS, into="knobs")
@o.options(SETTINGS, into="settings")
def serve(
    ctx: typer.Context,
    model: o.ServeModel = None,
    name: o.Name = "m3ctl",
    port: o.Port = None,
    host: o.Host = "127.0.0.1",
    runtime: o.Runtime = None,
    served_model_name: o.ServedName = None,
    profile: o.Profile = None,
    arg: o.Arg = None,
    skip_checks: o.SkipChecks = False,
    inventory: o.Inventory = None,
    config: o.Config = None,
    knobs: dict | None = None,
    settings: dict | None = None,
    json_out: o.Json = False,
    startup_timeout: Annotated[
        float | None,
        typer.Option(
            parser=o.positive_float, metavar="SECONDS", help="Readiness budget in seconds (default: from model size)."
        ),
    ] = None,
    image: Annotated[
        str | None,
        typer.Option(parser=o.image_ref, help="Container image for --runtime docker (default: the profile's)."),
    ] = None,
) -> None:
    """Plan, launch and wait until the server really serves (then watch it, or return with --detach).

    Raw vLLM flags go after `--`; they pass the same plan rules as everything else.
    """

    out = Output(json_out)
    s = ServeSettings.model_validate({SETTING_FIELDS[k]: v for k, v in (settings or {}).items() if v is not None})
    if s.no_smoke and (settings or {}).get("smoke") not in (None, "off"):
        raise BadInput(f"--no-smoke contradicts --smoke {s.smoke}", "give one of them (--no-smoke is --smoke off)")
    level = "off" if s.no_smoke else str(s.smoke)
    req = given_request(ctx)  # the options given; the API layers them (--config, M3CTL_*, the config file)
    if "model" not in api.plan_request(req, config=config).model_fields_set:
        raise MissingParameter(ctx=ctx, param_hint="'--model' (or M3CTL_MODEL)", param_type="option")
    given: dict[str, Any] = dict(
        inventory=inventory, config=config, offline=(knobs or {}).get("offline"), api_key_env=s.api_key_env
    )
    if s.dry_run:
        show_dry_run(out, api.serve(req, dry_run=True, mounts=s.mounts, **given), level)
        if s.fallback == "auto" and not out.json:
            print_fallbacks(out, api.serve_fallbacks(req, mounts=s.mounts, **given))
        return
    launch(_Run(out, s.detach, s.watch_interval, s.restart), req, level, s.mounts, {**given, "fallback": s.fallback})


def launch(run: "_Run", req, level: str, mounts: list[str], given: dict[str, Any]) -> None:
    """Launch through m3ctl.api.serve (in the foreground: with its watch), showing each step; Ctrl-C (or
    SIGTERM/SIGHUP) after the launch began says what was stopped and exits 128 + the signal."""

    watch = None if run.detach else api.ServeWatch(run.interval, run.restart, run.on_watch, run.ready, run.stopping)
    try:
        res = api.serve(
            req,
            smoke=level,
            mounts=mounts,
            on_event=on_phase(run.out),
            on_pull=pull_printer(run.out),
            on_start=run.started,
            watch=watch,
            on_attempt=run.attempt,
            **given,
        )
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (serve.Terminated)
        if run.name is None:  # before the launch: nothing to stop
            raise
        run.say(f"stopped {run.name}" if run.is_ready else f"interrupted: {run.name} stopped before it was ready")
        raise typer.Exit(api.interrupt_exit_code(e)) from None
    if run.detach:
        run.ready(res)


class _Run:
    """What ``m3ctl serve`` shows of a launch: the command that starts, readiness, the foreground watch."""

    def __init__(self, out: Output, detach: bool, watch_interval: float, restart: str) -> None:
        self.out, self.detach, self.interval, self.restart = out, detach, watch_interval, restart
        self.name: str | None = None
        self.is_ready = False
        self._probes = None

    def started(self, p, command: str) -> None:
        """The ``starting`` line: the command that runs (m3ctl.api.launch_command), whole on one line when it fits."""
        out = self.out
        self.name = p.name
        self._probes = probe_printer(out, p.name)
        if not out.json:
            cmd = shell_lines(command, out.con.width - 2)
            out.print(
                f"starting {p.name}:"
                + (
                    f" {escape(cmd)}"
                    if "\n" not in cmd and len(cmd) + len(p.name) + 10 <= out.con.width
                    else "\n  " + escape(cmd).replace("\n", "\n  ")
                ),
                soft_wrap=True,
            )
        out.event("starting", name=p.name, command=command)

    def ready(self, res) -> None:
        """The ready deployment, its smoke findings and kernels (then, in the foreground, the watch line)."""
        out, dep = self.out, res.deployment
        self.is_ready = True
        out.event(
            "ready",
            deployment=dep.model_dump(mode="json"),
            time_to_ready_s=res.readiness.time_to_ready_s,
            kernels=[{"level": f.level, "message": f.message} for f in (res.kernels.findings if res.kernels else [])],
            day0=[
                {"id": f.id, "severity": f.severity, "message": f.message}
                for f in (res.kernels.day0 if res.kernels else [])
            ],
        )
        if not out.json:
            print_hang(
                out.con,
                "ready ",
                f"{dep.name} at {dep.url} (model {dep.served_model_name!r}) in "
                f"{res.readiness.time_to_ready_s:.1f} s; log {dep.log_path}",
                2,
                "green",
                (0, 5),
            )
            print_smoke(out.con, dep.smoke)
            print_kernels(out.con, res.kernels)
        if not self.detach:
            out.print(
                f"serving in the foreground (watchdog every {self.interval:g} s, restart {self.restart}); Ctrl-C stops it"
            )

    def attempt(self, a) -> None:
        """An attempt of ``--fallback auto`` (m3ctl.api.Attempt): one line, and a ``fallback`` event."""
        self.out.event("fallback", **a.to_dict())
        if not self.out.json:
            if a.outcome == "failed" and not a.remedy:  # the cause follows in the error line
                self.out.print(f"[red]fallback[/] attempt {a.attempt} {escape(a.then() or '')}", soft_wrap=True)
                return
            color = "green" if a.outcome == "ready" else "yellow"
            self.out.print(f"[{color}]fallback[/] {escape(a.line())}", soft_wrap=True)
            for why in a.skipped:
                self.out.print(f"  [dim]passed over: {escape(why)}[/]", soft_wrap=True)
            if (then := a.then()) is not None:
                self.out.print(f"  {escape(then)}", soft_wrap=True)

    def on_watch(self, e) -> None:
        """A watchdog event, one line (m3ctl.cli.watch.probe_printer)."""
        if self._probes is not None:
            self._probes(e)

    def stopping(self) -> None:
        self.say("stopping… (further Ctrl-C or signals are ignored until the server is down)")

    def say(self, text: str) -> None:
        """A line after an interruption: on a fresh console (the signal may have landed inside a print, which can
        leave that console holding what is printed next), or an ``interrupted`` event with --json."""
        if self.out.json:
            self.out.event("interrupted", detail=text)
        else:
            console().print(text)


def show_dry_run(out: Output, p, level: str) -> None:

    if out.json:
        typer.echo(p.model_dump_json(indent=2))
        return
    print_plan(out.con, p)
    checks = (
        "skipped (--smoke off)"
        if level == "off"
        else f"{level}: " + "; ".join(planned_checks(p.argv, level, smoke_target(p)))
    )
    out.print(f"after readiness, smoke test: {escape(checks)}")


def print_fallbacks(out: Output, previews) -> None:
    """``serve --dry-run --fallback auto``: what a failure before ready would be relaunched with, per component."""
    out.print("on a failure before ready, --fallback auto would relaunch:")
    for p in previews:
        what = f"with {p.remedy}: {p.change}" if p.remedy else f"no relaunch ({p.reason})"
        what += "".join(f"; if it fails there again, with {t}" for t in p.then)
        out.print(f"  {escape(p.name)}: {escape(what)}", soft_wrap=True)
    out.print("  any other failure (a kill, the weight loader, the install, a refused setting...): no relaunch")


def on_phase(out: Output):
    """Readiness phases, one line each: ``✓ phase  12.3 s  what it waited for`` (``✗`` and the cause on a
    failure). On a terminal the phase in progress shows as ``…`` on that line until it ends; in a log file only
    the result lines are written. JSON Lines with ``--json``."""
    started: dict[str, str] = {}
    tty = not out.json and out.con.is_terminal

    def show(e) -> None:
        out.event("phase", phase=e.phase, status=e.status, elapsed_s=e.elapsed_s, detail=e.detail)
        if out.json:
            return
        if e.status == "start":
            started[e.phase] = e.detail
            if tty:  # replaced by the phase's result line
                out.con.print(
                    f"  [dim]…[/] {e.phase:<11} {escape(e.detail)}",
                    end="\r",
                    no_wrap=True,
                    overflow="ellipsis",
                    soft_wrap=False,
                )
            return
        if tty:
            out.con.file.write("\x1b[2K")
        ok = e.status == "ok"  # an ok event may carry its result (the smoke's checks and seconds)
        mark, detail = ("[green]✓[/]", e.detail or started.get(e.phase, "")) if ok else ("[red]✗[/]", e.detail)
        line = f"  {mark} {e.phase:<11} {e.elapsed_s:6.1f} s  {escape(detail)}".rstrip()
        if e.status == "ok":  # one line: what the phase waited for is a short note
            out.con.print(line, no_wrap=True, overflow="ellipsis", soft_wrap=False)
        else:  # the cause in full
            out.con.print(line, soft_wrap=True)

    return show


def pull_printer(out: Output):
    """docker's image pull, one line per layer state change (and a JSON ``pull`` event)."""
    seen: dict[str, str] = {}

    def progress(layer: str, status_: str, cur, total) -> None:
        if seen.get(layer) == status_:
            return
        if status_ not in ("Downloading", "Extracting"):
            seen[layer] = status_
            out.print(f"  [dim]pull[/] {escape(layer)} {escape(status_)}")
            out.event("pull", layer=layer, status=status_)
        elif total and cur:
            seen[layer] = status_
            out.print(f"  [dim]pull[/] {escape(layer)} {status_.lower()} {total / 2**20:.0f} MiB")
            out.event("pull", layer=layer, status=status_, total_bytes=total)

    return progress
