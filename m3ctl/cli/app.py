"""The Typer app: the root options, the commands (one module each), and the entry points.

Errors: every :class:`~m3ctl.errors.M3Error` and every usage error becomes ``error: <what was wrong>`` and
``hint: <what to do>`` on stderr with its exit code (m3ctl.errors: 1 checks failed, 2 bad input, 3 rejected
before launch, 4 launch failed, 130 interrupted); a traceback is shown only with ``--debug`` (or M3CTL_DEBUG=1).
"""

import atexit
import contextlib
import importlib
import os
import sys
import threading
import traceback
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Annotated, Any

import typer
from typer._click.exceptions import NoArgsIsHelpError as _NoCommand
from typer._click.utils import make_default_short_help
from typer._coercion import build_runtime_param
from typer.core import TyperGroup
from typer.exceptions import Abort as _Abort
from typer.exceptions import Exit as _Exit
from typer.exceptions import TyperException as _UsageBase
from typer.main import get_command, get_command_from_info, get_group
from typer.models import CommandInfo

from m3ctl import __version__
from m3ctl.cli.gc_pause import gc_paused
from m3ctl.cli.output import PLAIN_HELP, console, escape
from m3ctl.errors import EXIT_INTERRUPTED, EXIT_USAGE, BadInput, M3Error

#: The commands, in the order ``--help`` lists them: ``name: (module, attribute, short help)``. A command's
#: module is imported when the command is run (or its own help is asked): ``m3ctl --help`` imports none of
#: them, so neither pydantic nor the settings models (BenchConfig, TuneOptions) load for it. The attribute is
#: a command function, or a ``typer.Typer`` (a group: ``bench``, ``dev``). The short help is the command's own
#: (its docstring's first sentence, or its group's help): tests/cli/test_cli.py checks that they agree.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "doctor": (
        "m3ctl.cli.doctor",
        "doctor",
        "Probe this host and say, check by check, whether and how it can serve (exit 1 on FAIL or not runnable).",
    ),
    "plan": (
        "m3ctl.cli.plan",
        "plan",
        "Plan a launch for this host (or --inventory FILE, --system NAME): image, argv, env, every choice explained; start nothing.",
    ),
    "serve": (
        "m3ctl.cli.serve",
        "serve",
        "Plan, launch and wait until the server really serves (then watch it, or return with --detach).",
    ),
    "watch": (
        "m3ctl.cli.watch",
        "watch",
        "Watch a running deployment: liveness with a real 1-token completion and /metrics; exit 4 on failure.",
    ),
    "status": (
        "m3ctl.cli.status",
        "status",
        "List the deployments m3ctl started, with their phase, endpoint and uptime.",
    ),
    "stop": (
        "m3ctl.cli.stop",
        "stop",
        "Stop deployments: SIGTERM, then SIGKILL after the timeout; verify nothing is left.",
    ),
    "logs": ("m3ctl.cli.logs", "logs", "Print a deployment's server log."),
    "tune": (
        "m3ctl.cli.tune",
        "tune",
        "Search TP/DCP/DBO/EP, speculation depth and batching by measurement under an SLO (resumable).",
    ),
    "bench": (
        "m3ctl.cli.bench",
        "app",
        "Load-test an OpenAI-compatible endpoint; `m3ctl bench report` compares results.",
    ),
    "dev": ("m3ctl.cli.dev", "app", "Developer tools: tiny local models, vLLM CPU install fix-ups."),
}
#: Commands that take raw vLLM flags after ``--``.
_RAW = ("plan", "serve", "tune", "doctor")
RAW_ARGS = {"allow_extra_args": True, "ignore_unknown_options": False}  # raw vLLM flags only after `--`


def load_command(name: str):
    """The click command ``name`` of :data:`COMMANDS`, built from its module (imported now: the CLI boundary), its
    options' values completing in the shell (:func:`complete_values`)."""
    module, attr, _ = COMMANDS[name]
    with gc_paused():
        obj = getattr(importlib.import_module(module), attr)
    if isinstance(obj, typer.Typer):
        cmd = get_group(obj)
        cmd.name = name
        return lazy_coercion(complete_values(cmd))
    info = CommandInfo(name=name, callback=obj, context_settings=RAW_ARGS if name in _RAW else None)
    return lazy_coercion(
        complete_values(get_command_from_info(info, pretty_exceptions_short=False, rich_markup_mode=None))
    )


def complete_values(cmd):
    """``cmd`` (and its subcommands) with shell completion for every option whose parser knows its values (the
    parser's ``complete`` attribute, m3ctl.cli.options.completes: a choice, vLLM's choices of a flag, the catalog's
    variants or systems); an option's own ``autocompletion`` is kept. One place for every option of every command,
    so an option declared with such a parser completes in bash, zsh and fish without a word more."""
    for p in getattr(cmd, "params", []):
        info = getattr(getattr(p, "type_descriptor", None), "parameter_info", None)
        complete = getattr(getattr(info, "parser", None), "complete", None)
        if complete is not None and p._custom_shell_complete is None:
            p._custom_shell_complete = lambda ctx, param, incomplete, complete=complete: complete(incomplete)
    for sub in getattr(cmd, "commands", {}).values():
        complete_values(sub)
    return cmd


class LazyCoercion:
    """Typer's coercion of one option's value (its ``RuntimeParam``), built when a value is given: Typer builds a
    pydantic TypeAdapter for every option of the chosen command before parsing (42 for ``m3ctl plan``, ~5 ms),
    though an option left out has no value (None) and Typer answers None (``()`` for a repeatable option) without
    its adapter (typer._coercion.RuntimeParam.coerce: tests/cli/test_cli_help.py checks that they agree)."""

    __slots__ = ("built", "descriptor")

    def __init__(self, descriptor: Any) -> None:
        self.descriptor = descriptor
        self.built: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        """``value`` as Typer's own coercion gives it."""
        if value is None:
            return () if param.multiple or param.nargs == -1 else None
        if self.built is None:
            self.built = build_runtime_param(self.descriptor)
        return self.built.coerce(value, param=param, ctx=ctx)


def lazy_coercion(cmd):
    """``cmd`` (and its subcommands) with each option's coercion built on its first value (:class:`LazyCoercion`)."""
    _lazy_params(cmd)
    for sub in getattr(cmd, "commands", {}).values():
        lazy_coercion(sub)
    return cmd


def _lazy_params(cmd) -> None:
    for p in getattr(cmd, "params", []):
        if getattr(p, "_runtime_param", False) is None and hasattr(p, "type_descriptor"):
            p._runtime_param = LazyCoercion(p.type_descriptor)


class _LazyCommands(MutableMapping):
    """The root group's ``commands``: every name of :data:`COMMANDS` is there; a command is built on first use."""

    def __init__(self, given: Mapping) -> None:
        self.loaded: dict = dict(given)

    def __getitem__(self, name: str):
        if name not in self.loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self.loaded[name] = load_command(name)
        return self.loaded[name]

    def __setitem__(self, name: str, cmd) -> None:
        self.loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self.loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from COMMANDS
        yield from (n for n in self.loaded if n not in COMMANDS)

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self.loaded))


class LazyGroup(TyperGroup):
    """The root command group: the commands of :data:`COMMANDS`, each imported when it is used; the command list
    of ``m3ctl --help`` is written from their short help without importing them."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.commands = _LazyCommands(self.commands)

    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)  # the names only: nothing imported

    def format_commands(self, ctx, formatter) -> None:
        loaded = self.commands.loaded if isinstance(self.commands, _LazyCommands) else self.commands
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for n in names:
            if n in loaded:
                if loaded[n].hidden:
                    continue
                rows.append((n, loaded[n].get_short_help_str(limit)))
            else:
                rows.append((n, _short(COMMANDS[n][2], limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _short(text: str, limit: int) -> str:
    """``text`` cut as click cuts a short help (at a word, ``...`` when longer than ``limit``)."""
    return make_default_short_help(text, limit)


def redact_text(text: str) -> str:
    """``text`` with every secret m3ctl has seen masked (m3ctl.core.secrets.redact_text; imported on errors only)."""
    from m3ctl.core.secrets import redact_text as redact  # noqa: PLC0415

    return redact(text)


app = typer.Typer(
    cls=LazyGroup,
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


def warn_unknown_env() -> None:
    """One line on stderr naming ``M3CTL_`` variables m3ctl does not read (a typo would be ignored silently)."""
    from m3ctl.assess.request import ENV_FIELDS, check_env, unknown_env  # noqa: PLC0415

    check_env()
    if names := unknown_env():
        console(stderr=True).print(
            f"warning: unknown environment variable(s) {', '.join(names)} ignored; m3ctl "
            f"reads {', '.join(ENV_FIELDS)}, M3CTL_STATE_DIR, M3CTL_CATALOG_DIR, M3CTL_DEBUG",
            soft_wrap=True,
        )


def _command_of(args: list[str]) -> str:
    """The command path of ``args`` for a hint (``bench report``), from the first words that are not options; ""
    when the first is no command (``m3ctl nosuchcmd``: the hint is ``m3ctl --help``)."""
    words: list[str] = []
    for a in args:
        if a.startswith("-") or len(words) == 2:
            break
        words.append(a)
    if words[:1] and words[0] not in COMMANDS:
        return ""
    return " ".join(words[:2] if words[:1] in (["bench"], ["dev"]) else words[:1])


# ------------------------------------------------------------------ an option given twice
def check_repeated(root: Any, args: list[str]) -> None:
    """Refuse an option that takes one value given twice with different values, under one name or two of its
    aliases (``--concurrency 4 --max-concurrency 8``: click would keep the last without a word). ``root`` is the
    click command of the app; ``args`` the command line (what follows ``--`` is vLLM's, not checked here).

    Raises:
        BadInput: naming both spellings and values.
    """
    cmd, words = root, list(args[: args.index("--")] if "--" in args else args)
    while words and hasattr(cmd, "commands") and not words[0].startswith("-"):
        nxt = cmd.commands.get(words[0])
        if nxt is None:
            return  # an unknown command: click says so
        cmd, words = nxt, words[1:]
    single = {
        o: p
        for p in getattr(cmd, "params", [])
        if getattr(p, "param_type_name", "") == "option" and not p.multiple and not p.is_flag and not p.count
        for o in p.opts
    }
    seen: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, val = w.partition("=") if w.startswith("--") else (w, "", "")
        p = single.get(name)
        i += 1
        if p is None:
            continue
        if not eq:
            if i >= len(words):
                return  # no value: click says so
            val, i = words[i], i + 1
        if p.name in seen and seen[p.name][1] != val:
            first, v0 = seen[p.name]
            same = "given twice" if first == name else f"given twice ({name} is another name of {first})"
            raise BadInput(f"{first} {v0} and {name} {val}: one option {same} with different values", "give it once")
        seen.setdefault(p.name, (name, val))


def root_command():
    """The click command of :data:`app`, its own options' coercion built on their first value (:func:`lazy_coercion`:
    ``--version``, ``--debug`` and the completion options, four adapters every command built, ~1 ms)."""
    root = get_command(app)
    _lazy_params(root)  # its commands: each made lazy when loaded (load_command)
    return root


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the app and map errors to one line + exit code."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("M3CTL_DEBUG") == "1"
    try:
        if any(k.startswith("M3CTL_") for k in os.environ):
            warn_unknown_env()  # and refuses a bad value of one m3ctl reads (m3ctl.assess.request.check_env)
        root = root_command()  # built once: the chosen command's options are read by both calls
        check_repeated(root, args)
        with gc_paused() if _command_of(args) in PAUSED_RUNS else contextlib.nullcontext():
            rv = root(args=args, prog_name="m3ctl", standalone_mode=False)  # app(...) would build it again
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
        cmd = _command_of(args)
        if isinstance(e, _NoCommand):  # `m3ctl`, `m3ctl dev`: the help (its message), then what was wrong
            err.print(escape(e.format_message()), soft_wrap=True)
            err.print("error: no command given", soft_wrap=True)
            err.print(
                f"hint: pick one of the commands above; `m3ctl {cmd + ' ' if cmd else ''}COMMAND --help` says more"
            )
            return EXIT_USAGE
        err.print(f"error: {escape(redact_text(e.format_message()))}", soft_wrap=True)
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


#: Commands whose whole run is a short computation (no server, no load, no wait): it runs with the cyclic garbage
#: collector paused as a command's import does (:func:`gc_paused`): the planner's layout search and the modules it
#: imports on first use (the API verb, rich) allocate ~50 collections' worth of objects and leave little cyclic
#: garbage; the collections cost ``m3ctl plan`` ~6 ms.
PAUSED_RUNS = ("plan",)


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
        _flush()
        os._exit(code)
    if _alone():
        quick_exit(code)
    sys.exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be shown
            pass


def _alone() -> bool:
    """Whether nothing needs the interpreter's own exit: the main thread is the only thread left that it would
    join, and no profiler, tracer or debugger is installed (``python -m cProfile`` writes its report after the
    program, coverage and pdb hook the exit)."""
    if sys.getprofile() is not None or sys.gettrace() is not None:
        return False
    return all(t.daemon or t is threading.main_thread() for t in threading.enumerate())


def quick_exit(code: int) -> None:
    """Leave with ``code`` as the interpreter would, without tearing it down: the exit handlers run
    (``atexit``: logging, ``weakref.finalize``, coverage...), stdout and stderr are flushed, then ``os._exit``.

    Tearing down the ~60,000 objects and ~400 modules of a command costs ``m3ctl plan`` ~35 ms, a tenth of its
    start-up, and does nothing the process needs: m3ctl writes its files whole (m3ctl.core.files) and leaves no file
    open. :func:`run` takes this exit only when no other thread is alive that the interpreter would join
    (a thread pool's workers): then it exits as usual."""
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)
