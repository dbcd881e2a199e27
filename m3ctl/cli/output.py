"""The one output sink of a command: human (rich text and tables) or JSON.

Every command takes ``--json``. A command that ends with one result prints it as one JSON document
(:meth:`Output.result`); a command that streams (``serve`` in the foreground, ``watch``, ``logs --follow``)
prints JSON Lines: one object per event (:meth:`Output.event`), each with an ``"event"`` key. Errors go to
stderr as ``error: <what>`` / ``hint: <fix>`` (m3ctl.cli.app.main) in both modes.
"""

import json
import os
import re
import shlex
import sys
import textwrap
from typing import Any

#: Typer settings of every command group: click's plain help (Typer's rich help costs ~0.2 s of imports).
PLAIN_HELP: dict[str, Any] = {"rich_markup_mode": None}

#: Columns of output that goes to a pipe or a file with no ``COLUMNS`` set (rich's own default, 80, squeezes the
#: wide tables, e.g. ``m3ctl plan --systems all | less``, into cut cells).
PIPE_WIDTH = 200


def console(stderr: bool = False):
    """A rich console without highlighting and without emoji codes (``:b:`` in a user's ``--mount a:b:c:d`` printed
    as an emoji; brackets are escaped where text is printed: :func:`escape`); soft wrap, so a long line is wrapped
    by the terminal, not cut. Output that is not a terminal is :data:`PIPE_WIDTH` columns wide unless ``COLUMNS``
    says otherwise."""
    from rich.console import Console  # noqa: PLC0415

    stream = sys.stderr if stderr else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty())
    width = PIPE_WIDTH if piped and not os.environ.get("COLUMNS") else None
    return Console(stderr=stderr, highlight=False, emoji=False, soft_wrap=True, width=width)


def escape(text: str) -> str:
    """Escape rich markup in dynamic text (log lines and paths contain brackets)."""
    from rich.markup import escape as _esc  # noqa: PLC0415

    return _esc(str(text))


#: A number and its unit ("21.9 s", "8 GPU(s)") are never split over two lines.
_UNIT = r"(\d) (s|ms|GiB|MiB|tokens|GPU\(s\)|%)(?!\w)"


def hang(head: str, text: str, width: int, indent: int | None = None) -> str:
    """``head`` + ``text`` wrapped at ``width`` columns at word boundaries (never inside a number, a path, or
    between a number and its unit), later lines indented to ``indent`` (default: under the text); plain text,
    no trailing spaces."""
    text = re.sub(_UNIT, "\\1\x00\\2", text)  # glued for textwrap, a space again below

    pad = " " * (len(head) if indent is None else indent)
    lines = []
    for i, para in enumerate(text.split("\n")):
        first = head if i == 0 else pad
        lines += textwrap.wrap(
            para,
            max(len(pad) + 20, width),
            initial_indent=first,
            subsequent_indent=pad,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [first.rstrip()]
    return "\n".join(lines).replace("\x00", " ")


def _shell_words(command: str) -> list[str]:
    """The words of a shell command line as written (quotes and escapes kept), split at unquoted blanks."""
    words, cur, quote, escaped = [], "", "", False
    for ch in command:
        if escaped:
            cur, escaped = cur + ch, False
        elif ch == "\\" and quote != "'":
            cur, escaped = cur + ch, True
        elif quote:
            cur += ch
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            cur, quote = cur + ch, ch
        elif ch.isspace():
            if cur:
                words.append(cur)
            cur = ""
        else:
            cur += ch
    return [*words, cur] if cur else words


def shell_lines(command: str, width: int, indent: int = 4) -> str:
    """A shell command as lines of at most ``width`` columns joined by `` \\`` continuations (still one command
    when pasted into a shell); a flag stays on one line with its values. One line when it fits."""
    if len(command) <= width:
        return command
    try:
        shlex.split(command)
    except ValueError:
        return command
    groups: list[list[str]] = [[]]
    for t in _shell_words(command):  # each word as written: its quoting is kept (``K="$VAR"`` stays a binding)
        if t.startswith("-") and groups[-1]:
            groups.append([])
        groups[-1].append(t)
    lines = [""]
    for g in groups:
        part = " ".join(g)
        if lines[-1].strip() and len(lines[-1]) + 1 + len(part) + 2 > width:
            lines.append(" " * indent)
        if len(lines[-1]) + 1 + len(part) + 2 <= width:
            lines[-1] += (" " if lines[-1].strip() else "") + part
            continue
        for t in g:  # too long for a line of its own: its words go on as many lines as they need
            if lines[-1].strip() and len(lines[-1]) + 1 + len(t) + 2 > width:
                lines.append(" " * indent)
            lines[-1] += (" " if lines[-1].strip() else "") + t
    return " \\\n".join(lines)


def print_hang(
    con, head: str, text: str, indent: int | None = None, style: str | None = None, span: tuple[int, int] | None = None
) -> None:
    """Print :func:`hang` at the console's width (80 in a log file) as plain text; ``style`` colours the
    characters ``span`` of the first line (a status word)."""
    from rich.text import Text  # noqa: PLC0415

    t = Text(hang(head, text, con.width, indent))
    if style and span:
        t.stylize(style, *span)
    con.print(t, soft_wrap=True)


class Output:
    """Where a command's output goes. ``json_mode``: documents and events on stdout as JSON, human text off."""

    def __init__(self, json_mode: bool = False):
        self.json = json_mode
        self._con = None

    @property
    def con(self):
        """The stdout console of the human form (created on first use: rich costs ~50 ms to import)."""
        if self._con is None:
            self._con = console()
        return self._con

    def print(self, *args, **kw) -> None:
        """Human text on stdout; nothing in JSON mode."""
        if not self.json:
            self.con.print(*args, **kw)

    def echo(self, text: str) -> None:
        """Plain text on stdout (no markup, no wrapping); nothing in JSON mode."""
        if not self.json:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def result(self, doc: Any) -> None:
        """The command's result as one JSON document (JSON mode only)."""
        if self.json:
            sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
            sys.stdout.flush()

    def event(self, event: str, **fields: Any) -> None:
        """One JSON Lines record ``{"event": event, ...}`` of a streaming command (JSON mode only)."""
        if self.json:
            sys.stdout.write(json.dumps({"event": event, **fields}, default=str) + "\n")
            sys.stdout.flush()
