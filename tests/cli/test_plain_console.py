"""A plan printed to output that is no terminal goes through m3ctl.cli.output.PlainConsole: the bytes rich would
write, without importing rich (~20 ms of ``m3ctl plan``'s start-up). On the main before it, ``m3ctl plan`` loaded
rich (test_plan_loads_no_rich); each other test holds the byte-for-byte equality with rich's own console."""

from __future__ import annotations

import contextlib
import io

import pytest

from m3ctl.api import plan
from m3ctl.cli import output
from m3ctl.cli.output import PlainConsole, console, plain_console, print_hang, print_text
from m3ctl.cli.render import print_plan
from tests.test_structure import loaded_by

#: Texts with each thing rich changes or keeps: unicode, wide characters, a tab, the control codes it drops (and
#: one it keeps: ESC), blanks at a line's end, lines longer than the width, empty lines, markup-like brackets.
TEXTS = [
    "plan m3ctl: profile blackwell, runtime process, http://127.0.0.1:8000",
    "  parallel = TP 8 x DP 1  (best of 3 passing layout(s) out of 4 tried)",
    "a [bold]b[/] \\[c] :smile: ≤ 3 × 2 — 漢字 🙂",
    "tab\there and\tthere",
    "bell\a back\b vt\v ff\f cr\r esc\x1b[1m",
    "trailing blank   \nnext line\t \n",
    "x" * 250 + "   ",
    "",
    "\n\nthree lines\n",
    "nbsp at the end\u00a0",
]


def _capture(fn) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn()
    return buf.getvalue()


@pytest.fixture(params=[None, "80", "37"], ids=["piped", "COLUMNS=80", "COLUMNS=37"])
def columns(request, monkeypatch):
    for var in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR"):
        monkeypatch.delenv(var, raising=False)
    if request.param:
        monkeypatch.setenv("COLUMNS", request.param)
    return request.param


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_is_written_as_rich_writes_it(columns, text):
    def plain() -> None:
        con = plain_console()
        assert isinstance(con, PlainConsole)
        print_text(con, text, "bold", (0, 4))

    assert _capture(plain) == _capture(lambda: print_text(console(), text, "bold", (0, 4)))


def test_the_width_is_riches(columns):
    assert _capture(lambda: print(plain_console().width)) == _capture(lambda: print(console().width))


@pytest.mark.parametrize("system", ["b200x8", "h200x8", "mi355xx8", "gb300x4"])
def test_a_plan_is_printed_as_rich_prints_it(columns, system):
    p = plan(system=system, args={"max-num-seqs": 64}, env={"NOTE": "a\tb  "})
    hung = _capture(lambda: print_hang(plain_console(), "head ", "word " * 60, 4, "dim", (0, 4)))
    assert hung == _capture(lambda: print_hang(console(), "head ", "word " * 60, 4, "dim", (0, 4)))
    assert _capture(lambda: print_plan(plain_console(), p)) == _capture(lambda: print_plan(console(), p))


@pytest.mark.parametrize(("var", "value"), [("FORCE_COLOR", "1"), ("TTY_COMPATIBLE", "1")])
def test_output_forced_to_a_terminal_gets_riches_styles(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    assert plain_console() is None
    out = _capture(lambda: print_plan(output.Output().lines, plan(system="b200x8")))
    assert out.startswith("\x1b[1mplan\x1b[0m ")


def test_a_width_rich_would_compute_from_the_terminal_gets_rich(monkeypatch):
    monkeypatch.setenv("COLUMNS", "wide")
    assert plain_console() is None


def test_plan_loads_no_rich():
    assert [m for m in loaded_by("plan", "--system", "b200x8") if m.split(".")[0] == "rich"] == []
