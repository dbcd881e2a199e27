"""The Typer app: the root options, the commands (one module each), and the entry points.

Errors: every :class:`~m3ctl.errors.M3Error` and every usage error becomes ``error: <what was wrong>`` and
``hint: <what to do>`` on stderr with its exit code (m3ctl.errors: 1 checks failed, 2 bad input, 3 rejected
before launch, 4 launch failed, 130 interrupted); a traceback is shown only with ``--debug`` (or M3CTL_DEBUG=1).
"""

import os
import sys
import traceback
from typing import Annotated

import typer
from typer.exceptions import Abort as _Abort
from typer.exceptions import Exit as _Exit
from typer.exceptions import TyperException as _UsageBase

from m3ctl import __version__
from m3ctl.cli import bench, bench_report, dev, doctor, logs, plan, serve, status, stop, tune, watch
from m3ctl.cli.options import PLAIN_HELP, RAW_ARGS
from m3ctl.cli.output import console, escape
from m3ctl.errors import EXIT_INTERRUPTED, EXIT_USAGE, M3Error


def redact_text(text: str) -> str:
    """``text`` with every secret m3ctl has seen masked (m3ctl.secrets.redact_text; imported on errors only)."""
    from m3ctl.secrets import redact_text as redact  # noqa: PLC0415

    return redact(text)


app = typer.Typer(
    help="Get MiniMax-M3.1-Flash serving on vLLM, fast and correctly, on the GPUs at hand.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    **PLAIN_HELP,
)


def _version_cb(value: bool) -> None:
    if value:
        typer.echo(f"m3ctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_cb, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    if debug:
        os.environ["M3CTL_DEBUG"] = "1"


app.command()(doctor.doctor)
app.command(context_settings=RAW_ARGS)(plan.plan)
app.command(context_settings=RAW_ARGS)(serve.serve)
app.command()(watch.watch)
app.command()(status.status)
app.command()(stop.stop)
app.command()(logs.logs)
bench.app.command("report")(bench_report.bench_report)
app.add_typer(bench.app, name="bench")
app.command(context_settings=RAW_ARGS)(tune.tune)
app.add_typer(dev.app, name="dev")


def warn_unknown_env() -> None:
    """One line on stderr naming ``M3CTL_`` variables m3ctl does not read (a typo would be ignored silently)."""
    from m3ctl.assess.request import ENV_FIELDS, unknown_env  # noqa: PLC0415

    if names := unknown_env():
        console(stderr=True).print(
            f"warning: unknown environment variable(s) {', '.join(names)} ignored; m3ctl "
            f"reads {', '.join(ENV_FIELDS)}, M3CTL_STATE_DIR, M3CTL_CATALOG_DIR, M3CTL_DEBUG",
            soft_wrap=True,
        )


def _command_of(args: list[str]) -> str:
    """The command path of ``args`` for a hint (``bench report``), from the first words that are not options."""
    words = []
    for a in args:
        if a.startswith("-") or len(words) == 2:
            break
        words.append(a)
    return " ".join(words[:2] if words[:1] in (["bench"], ["dev"]) else words[:1])


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app and map errors to one line + exit code."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("M3CTL_DEBUG") == "1"
    if any(k.startswith("M3CTL_") for k in os.environ):
        warn_unknown_env()
    try:
        rv = app(args=args, prog_name="m3ctl", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except _Exit as e:
        return e.exit_code
    except _Abort:
        console(stderr=True).print("interrupted")
        return EXIT_INTERRUPTED
    except _UsageBase as e:  # Typer's (vendored click) usage errors: one line, then where to look
        if debug:
            traceback.print_exc()
        err = console(stderr=True)
        err.print(f"error: {escape(redact_text(e.format_message()))}", soft_wrap=True)
        cmd = _command_of(args)
        err.print(f"hint: see `m3ctl {cmd + ' ' if cmd else ''}--help`", soft_wrap=True)
        return e.exit_code if e.exit_code else EXIT_USAGE
    except M3Error as e:
        if debug:
            traceback.print_exc()
        err = console(stderr=True)
        err.print(f"[red]error:[/] {escape(redact_text(e.message))}", soft_wrap=True)  # no secret in a message
        if e.hint:
            err.print(f"[dim]hint:[/] {escape(redact_text(e.hint))}", soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        console(stderr=True).print("interrupted")
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - last-resort mapping, traceback with --debug
        if debug:
            traceback.print_exc()
        err = console(stderr=True)
        err.print(f"[red]internal error:[/] {type(e).__name__}: {escape(redact_text(str(e)))}", soft_wrap=True)
        err.print("[dim]hint:[/] rerun with --debug for the traceback and report it")
        return 1


#: Exit statuses of an interruption (128 + SIGHUP, SIGINT, SIGTERM): see :func:`run`.
INTERRUPT_EXIT_CODES = frozenset({129, EXIT_INTERRUPTED, 143})


def run() -> None:
    """Console entry point (and ``python -m m3ctl``).

    After an interruption that m3ctl handled (servers stopped, results saved, exit 130/143/129), the process
    leaves with ``os._exit`` once stdout and stderr are flushed. CPython 3.11 marks a KeyboardInterrupt as
    unhandled when it is raised inside ``exec()``/``eval()`` code (a dataclass or namedtuple being created,
    e.g. during an import) even when it is caught later (``_Py_UnhandledKeyboardInterrupt``, set in
    Python/pythonrun.c ``run_eval_code_obj``); under ``python -m m3ctl`` the interpreter then kills itself
    with SIGINT at exit: status -2 instead of 130 (CI, stop 12). Nothing is left to clean up on this path:
    the bench's worker pool is a context manager and the serve/tune handlers have stopped their servers.
    """
    code = main()
    if code in INTERRUPT_EXIT_CODES:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can be shown
                pass
        os._exit(code)
    sys.exit(code)
