"""How the ``m3ctl`` process starts and leaves (m3ctl.cli.app): a command's import runs with the cyclic garbage
collector paused and frozen after it, and so does the whole run of a short command (``plan``); the process leaves without tearing the interpreter down (``os._exit`` after
the exit handlers and a flush of stdout and stderr), unless a thread, a profiler or a tracer needs the usual exit.
Both are start-up work of every command (benchmarks/startup.py)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

from m3ctl import api
from m3ctl.cli.app import gc_paused, main
from m3ctl.errors import EXIT_USAGE, BadInput

REPO = Path(__file__).resolve().parents[2]

#: A program that runs ``m3ctl ARGV`` through the console entry point (m3ctl.cli.run) with an object whose
#: finalizer reports the interpreter's teardown and an exit handler that reports itself; ``SETUP`` runs first.
PROGRAM = """
import atexit, sys
from m3ctl.cli import run
class Teardown:
    def __del__(self):
        sys.stderr.write("torn down\\n")
keep = Teardown()
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
{setup}
sys.argv = ["m3ctl", *{argv!r}]
run()
"""


def _run(*argv: str, setup: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    code = PROGRAM.format(setup=setup, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_a_command_leaves_without_the_teardown_its_output_whole_and_its_exit_handlers_run(capsys):
    p = _run("plan", "--system", "b200x8")
    assert p.returncode == 0, p.stderr
    assert main(["plan", "--system", "b200x8"]) == 0
    assert p.stdout == capsys.readouterr().out  # all of it reached the pipe
    assert p.stdout.startswith("plan m3ctl: profile blackwell")
    assert "exit handler ran" in p.stderr
    assert "torn down" not in p.stderr


def test_an_error_keeps_its_exit_code_on_the_quick_exit():
    p = _run("plan", "--system", "nosuchsystem")
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ")
    assert "torn down" not in p.stderr


def test_a_thread_left_running_gets_the_usual_exit():
    # a thread that ends when the main thread does: the usual exit marks it ended, then joins the others
    setup = "import threading\nthreading.Thread(target=threading.main_thread().join).start()\n"
    p = _run("--version", setup=setup)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("m3ctl ")
    assert "torn down" in p.stderr


def test_a_profiler_gets_the_usual_exit(tmp_path):
    """``python -m cProfile`` writes its report after the program has returned."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    out = tmp_path / "plan.prof"
    cmd = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "m3ctl", "--version"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("m3ctl ")
    assert out.stat().st_size > 0


def test_a_commands_import_pauses_the_collector_and_freezes_what_it_made():
    before = gc.get_freeze_count()
    try:
        with gc_paused():
            assert not gc.isenabled()
            made = [[i] for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(made)
    finally:
        gc.unfreeze()
        gc.enable()


def test_a_paused_collector_stays_off_when_it_was_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_plan_runs_with_the_collector_paused_and_turns_it_on_again(monkeypatch):
    seen = []

    def planned(*args, **kwargs):
        seen.append(gc.isenabled())
        raise BadInput("stop here", "nothing to plan")

    monkeypatch.setattr(api, "plan", planned)
    try:
        assert main(["plan", "--system", "b200x8"]) == EXIT_USAGE
    finally:
        gc.unfreeze()
    assert seen == [False]
    assert gc.isenabled()


def test_the_clis_own_imports_run_with_the_collector_paused_and_leave_it_on():
    """m3ctl.cli imports Typer and the app with the collector paused (m3ctl.cli.gc_pause) and freezes nothing: no
    collection from the start of Typer's import to the end of the CLI's, in every command's start-up, ``--help``
    included. (The m3ctl package, imported before the pause, can start a collection of its own when it is compiled
    without cached bytecode, as on a fresh checkout: those are not counted.)"""
    code = (
        "import gc, sys\nseen = []\n"
        "gc.callbacks.append(lambda phase, info: seen.append(phase) if 'typer' in sys.modules else None)\n"
        "frozen = gc.get_freeze_count()\nimport m3ctl.cli\n"
        "print(len(seen), gc.isenabled(), gc.get_freeze_count() == frozen, 'typer' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("M3CTL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "True", "True", "True"]


def test_an_unfrozen_pause_moves_what_it_made_to_the_oldest_generation():
    gc.unfreeze()  # as nothing is frozen before the CLI's imports
    with gc_paused(freeze=False):
        made = [[i] for i in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == 0
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(m) in oldest for m in made)
