"""`m3ctl --help` stays light (issue 26): the root command list is written from m3ctl.cli.app.COMMANDS without
importing any command module, and each entry's short help is the command's own."""

from __future__ import annotations

import os
import subprocess
import sys

from m3ctl.cli.app import COMMANDS, load_command

#: Modules `m3ctl --help` must not import: the command modules, pydantic and the settings models it builds,
#: the engine libraries.
HEAVY = (
    "pydantic",
    "m3ctl.loadgen.config",
    "m3ctl.tuning.options",
    "m3ctl.api",
    "m3ctl.cli.bench",
    "m3ctl.cli.tune",
    "m3ctl.cli.serve",
    "m3ctl.cli.plan",
    "rich",
    "torch",
    "vllm",
    "docker",
    "pynvml",
)


def test_root_help_imports_no_command_module_nor_pydantic():
    code = (
        "import sys\n"
        "from m3ctl.cli import main\n"
        "rc = main(['--help'])\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print(rc)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}  # an M3CTL_* set: its name is checked
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    *help_lines, loaded, rc = p.stdout.strip().splitlines()
    assert loaded == "[]" and rc == "0"
    text = "\n".join(help_lines)
    for name in COMMANDS:
        assert f"\n  {name} " in text, name


def test_the_short_help_of_each_command_is_its_own():
    """COMMANDS' short help is what click derives from the command itself (its docstring or group help)."""
    from typer._click.utils import make_default_short_help

    for name, (_, _, short) in COMMANDS.items():
        cmd = load_command(name)
        assert cmd.name == name
        for limit in (45, 60, 200):
            assert cmd.get_short_help_str(limit) == make_default_short_help(short, limit), name


def test_the_commands_load_on_use_and_keep_their_subcommands():
    import typer.main

    from m3ctl.cli import app

    root = typer.main.get_command(app)
    assert list(root.commands) == list(COMMANDS)
    assert set(root.commands["bench"].commands) == {"report"}
    assert {"tiny-model", "scale-model", "fix-vllm"} <= set(root.commands["dev"].commands)


def test_no_command_shows_the_help_then_one_error_line(capsys):
    """`m3ctl` alone printed the whole help as its error message ("error: Usage: m3ctl [OPTIONS] ..."), as did
    `m3ctl dev`: the help stays, and what was wrong is one line at the end, with the hint, exit 2."""
    from m3ctl.cli import main

    for argv, cmds in (([], ("doctor", "plan", "bench")), (["dev"], ("tiny-model", "scale-model"))):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert not any(line.startswith("error: Usage") for line in err), err
        assert err[-2] == "error: no command given" and err[-1].startswith("hint: "), err
        assert all(any(c in line for line in err) for c in cmds), err


def _params(cmd):
    yield from getattr(cmd, "params", [])
    for sub in getattr(cmd, "commands", {}).values():
        yield from _params(sub)


def test_an_option_left_out_coerces_as_typer_does_without_building_its_adapter():
    """Every option of every command (and the root's) coerces through m3ctl.cli.app.LazyCoercion: no value (an option left out) gives
    what Typer's own coercion gives, with no TypeAdapter built; a value is Typer's own coercion of it."""
    from typer._coercion import build_runtime_param

    from m3ctl.cli.app import LazyCoercion, root_command

    seen = 0
    root = root_command()
    for cmd in (root, *(load_command(name) for name in COMMANDS)):
        for p in root.params if cmd is root else _params(cmd):  # the root's: not every command loaded
            if not hasattr(p, "type_descriptor"):
                continue
            lazy = p.get_runtime_param()
            assert isinstance(lazy, LazyCoercion), (cmd.name, p.name)
            own = build_runtime_param(p.type_descriptor).coerce(None, param=p, ctx=None)
            assert lazy.coerce(None, param=p, ctx=None) == own and type(own) is type(lazy.coerce(None, p, None))
            assert lazy.built is None, (cmd.name, p.name)
            seen += 1
    assert seen > 100
    plan = load_command("plan")
    nodes = next(p for p in plan.params if p.name == "nodes")
    assert nodes.get_runtime_param().coerce("3", param=nodes, ctx=None) == 3
    assert type(nodes.get_runtime_param().built) is type(build_runtime_param(nodes.type_descriptor))
