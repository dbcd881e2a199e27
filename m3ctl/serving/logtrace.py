"""Read a vLLM server log as processes, tracebacks and exceptions (no judgement: :mod:`m3ctl.serving.diagnose` decides).

vLLM interleaves several processes in one log, each line optionally prefixed:

- a process tag ``(EngineCore_DP0 pid=123)``, ``(Worker_TP1 pid=..)``, ``(APIServer pid=..)``, Ray's
  ``(RayWorkerWrapper pid=.., ip=..)`` or ``(pid=..)``; torch's ``[rank0]:``;
- a log header ``ERROR 12-01 10:00:00 [file.py:12]`` (vLLM's logger, one space before the message, so a
  traceback body keeps its indentation) or ``ERROR:    `` (uvicorn).

A Python traceback is ``Traceback (most recent call last):``, frames (``File "f.py", line N, in func`` and
their source lines), then the exception line ``Type: message`` and, for some exceptions, more message lines
(pydantic's ``1 validation error for ModelConfig`` then ``  Value error, <cause> [type=value_error, ...]``;
torch's CUDA errors then ``CUDA kernel errors might be asynchronously reported ...``). Chained exceptions
("The above exception was the direct cause of the following exception:", "During handling of the above
exception, another exception occurred:") are printed cause first. Ray prints
``ray.exceptions.RayTaskError(Type): ray::Actor.method() (pid=.., ip=..)`` followed by the remote frames and
the remote exception. Lines that are not part of a traceback but look like errors (``Failed: Cuda error ...``,
``Memory access fault by GPU node-3``, NCCL ``WARN`` lines, ERROR-level messages) are events of their own.

Format references: Python's traceback module (https://docs.python.org/3/library/traceback.html), vLLM's log
format (https://github.com/vllm-project/vllm/blob/main/vllm/logger.py), pydantic's ValidationError text
(https://docs.pydantic.dev/latest/errors/validation_errors/), Ray's RayTaskError
(https://docs.ray.io/en/latest/ray-core/api/doc/ray.exceptions.RayTaskError.html).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# "(EngineCore_DP0 pid=120) ", "(RayWorkerWrapper pid=5, ip=10.0.0.2) ", "(pid=5) ", then "[rank0]:", then a level.
_HEAD = re.compile(
    r"^(?:\((?:(?P<proc>[A-Za-z_][\w.:-]*) )?pid=(?P<pid>\d+)[^)]*\) ?)?"
    r"(?:\[rank(?P<rank>\d+)\]:)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
    r"(?: (?P<ts>\d\d-\d\d [\d:.]+) \[(?P<loc>[^\]]*)\] ?|:\s+))?"
)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?\s*$')
_TB_START = re.compile(
    r"(?:^\s*|: )Traceback \(most recent call last\):\s*$"
)  # SGLang: "... hit an exception: Traceback ..."
_RAY_START = re.compile(r"^(?P<type>(?:ray\.exceptions\.)?Ray\w*Error)\((?P<inner>[\w.]+)\): (?P<msg>ray::.*)$")
_CHAIN = re.compile(
    r"^\s*(The above exception was the direct cause of the following exception:|"
    r"During handling of the above exception, another exception occurred:)\s*$"
)
# "pkg.mod.TypeName: message" or a bare "TypeName" / "pkg.TypeName" (e.g. "AssertionError").
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:\([\w.]+\))?)(?::(?: (?P<msg>.*))?)?$")
_EXC_WORD = re.compile(r"(Error|Exception|Exit|Interrupt|Fault|Warning|Failure)(\([\w.]+\))?$")
# A line outside a traceback that reports a failure (C++ prints, fault handlers, NCCL WARN, HSA status).
ERRORISH = re.compile(
    r"(Error\b|Error:|Exception\b|error:|FAILED|Failed:|\b[Ff]ault\b|HSA_STATUS_ERROR|NCCL WARN"
    r"|Fatal Python error|Segmentation fault|Aborted|core dumped)"
)
_RAW = ("untagged", None)  # loose_loc of an untagged exception line reading its message lines
_PROGRESS = re.compile(r"(\d+%\|)|(\|\s*\d+/\d+ \[)|(it/s\]$)|(s/it\]$)")


@dataclass(frozen=True)
class LogLine:
    """One line of the log, its prefixes parsed.

    Attributes:
        index: 0-based line number in the text.
        raw: the line as written (ANSI colours removed).
        msg: the message without process tag, rank and log header.
        proc: process tag name (``EngineCore_DP0``, ``Worker_TP1``, ``APIServer``, ``RayWorkerWrapper``) or None.
        pid: process id from the tag, or None.
        level: ``DEBUG``/``INFO``/``WARNING``/``ERROR``/``CRITICAL`` from a log header, or None.
        loc: ``file.py:line`` of the logging call (vLLM header), or None.
        ts: the header's ``MM-DD HH:MM:SS`` time, or None.
    """

    index: int
    raw: str
    msg: str
    proc: str | None = None
    pid: int | None = None
    level: str | None = None
    loc: str | None = None
    ts: str | None = None

    @property
    def stream(self) -> tuple[str | None, int | None]:
        """The process whose output this line is (tag name, pid); (None, None) for untagged lines."""
        return (self.proc, self.pid)

    @property
    def process(self) -> str | None:
        """``EngineCore_DP0 pid=120`` style name of the process, or None."""
        if self.proc is None and self.pid is None:
            return None
        return f"{self.proc or 'pid'} pid={self.pid}" if self.proc else f"pid={self.pid}"


@dataclass(frozen=True)
class Frame:
    """A traceback frame: ``file`` (as printed), ``line`` (1-based), ``function`` (None when not printed),
    ``code`` (the source line printed under it, stripped; may be empty)."""

    file: str
    line: int
    function: str | None = None
    code: str = ""

    def where(self) -> str:
        """``path/to/file.py:123 (function)``, the path shortened to the part from ``vllm/`` (or the last 3 parts)."""
        return f"{short_path(self.file)}:{self.line}" + (f" ({self.function})" if self.function else "")


@dataclass
class ExcBlock:
    """One exception as printed: its frames (outermost first), type, message and the extra message lines.

    Attributes:
        exc_type: the exception type as printed (``torch.AcceleratorError``, ``ValueError``), or None for a
            loose error line that is not a Python exception (``Failed: Cuda error ...``).
        message: the first message line (may be empty).
        detail: the following message lines (pydantic's per-field errors, torch's CUDA notes), stripped.
        frames: the traceback's frames, outermost first (empty for a loose line or a logged exception string).
        lines: the log lines that make up this block (for quoting).
        header_line: the line holding the exception text (type and message).
    """

    exc_type: str | None = None
    message: str = ""
    detail: list[str] = field(default_factory=list)
    frames: list[Frame] = field(default_factory=list)
    lines: list[LogLine] = field(default_factory=list)
    header_line: LogLine | None = None

    @property
    def text(self) -> str:
        """Type, message, detail lines and the innermost frame's source line, one per line (patterns search it)."""
        head = f"{self.exc_type}: {self.message}" if self.exc_type else self.message
        parts = [head, *self.detail]
        if self.frames and self.frames[-1].code:
            parts.append(self.frames[-1].code)
        return "\n".join(parts)

    @property
    def innermost(self) -> Frame | None:
        """The frame where the exception was raised (the last printed), or None."""
        return self.frames[-1] if self.frames else None


@dataclass
class Event:
    """A failure seen in the log: one traceback (its chain of exceptions, cause first) or one loose error line
    (with the same-header lines that follow it), from one process.

    Attributes:
        chain: the exceptions, in print order (Python prints the original cause first).
        stream: (process tag, pid) of the lines; (None, None) when untagged.
        first: index of the event's first log line.
        traceback: True for a Python traceback (``Traceback ...`` or Ray's header), False for loose lines.
    """

    chain: list[ExcBlock]
    stream: tuple[str | None, int | None]
    first: int
    traceback: bool = False

    @property
    def process(self) -> str | None:
        """``Worker_TP0 pid=3101`` style name of the process, or None."""
        proc, pid = self.stream
        if proc is None and pid is None:
            return None
        return f"{proc} pid={pid}" if proc else f"pid={pid}"


def short_path(path: str) -> str:
    """``/usr/lib/python3.12/site-packages/vllm/v1/worker/x.py`` -> ``vllm/v1/worker/x.py``; other paths keep
    their last three parts."""
    p = path.replace("\\", "/")
    for anchor in ("/site-packages/", "/dist-packages/"):
        if anchor in p:
            return p.split(anchor, 1)[1]
    m = re.search(r"(?:^|/)((?:vllm|torch|triton|flashinfer|aiter|ray|transformers|pydantic)/.*)$", p)
    if m:
        out = m.group(1)
        while re.match(r"^(\w+)/\1/", out):  # a checkout named like its package: /opt/vllm/vllm/...
            out = out.split("/", 1)[1]
        return out
    return "/".join(p.split("/")[-3:])


def parse_line(index: int, raw: str) -> LogLine:
    """Split one log line into its prefixes and message (see the module docstring)."""
    raw = _ANSI.sub("", raw.rstrip("\r\n"))
    m = _HEAD.match(raw)
    if not m or m.end() == 0:
        return LogLine(index, raw, raw)
    level = m.group("level")
    if level == "WARN":
        level = "WARNING"
    return LogLine(
        index,
        raw,
        raw[m.end() :],
        m.group("proc"),
        int(m.group("pid")) if m.group("pid") else None,
        level,
        m.group("loc"),
        m.group("ts"),
    )


def is_ray_header(msg: str) -> bool:
    """Ray's ``RayTaskError(Type): ray::Actor.method() (pid=..)`` line (a wrapper of the remote exception)."""
    return bool(_RAY_START.match(msg.strip()))


def is_progress(msg: str) -> bool:
    """A tqdm progress bar line (``Capturing CUDA graphs ...:  53%|#####     | 27/51 [00:06<00:05, 4.14it/s]``)."""
    return bool(_PROGRESS.search(msg))


def exception_line(msg: str) -> tuple[str, str] | None:
    """(type, message) when ``msg`` is a Python exception line (``ValueError: x``, ``torch.AcceleratorError:
    ...``, a bare ``AssertionError``), else None. The type must end like an exception class name."""
    s = msg.strip()
    m = _EXC_LINE.match(s)
    if not m:
        return None
    t = m.group("type")
    if not _EXC_WORD.search(t.split(".")[-1]):
        return None
    return t, (m.group("msg") or "").strip()


class _Stream:
    """Parser state of one process's lines."""

    def __init__(self) -> None:
        self.chain: list[ExcBlock] = []
        self.block: ExcBlock | None = None  # the block being read (frames, then exception, then detail)
        self.reading_detail = False
        self.pending_chain = False  # a chaining sentence was seen: the next traceback continues the chain
        self.first = 0
        self.traceback = False
        self.loose: list[ExcBlock] = []  # a loose error with its same-header follow-up lines
        self.loose_loc: tuple[str | None, str | None] | None = None


class _EventParser:
    """Turns log lines, fed in order, into failure :class:`Event` s: each process's lines are read by their own
    :class:`_Stream` state (vLLM interleaves processes), a traceback's structure first, then loose lines."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.streams: dict[tuple[str | None, int | None], _Stream] = {}

    def close_chain(self, st: _Stream, key: tuple[str | None, int | None]) -> None:
        """End the traceback (and the loose event) ``st`` is reading: what it holds becomes an event."""
        self.close_loose(st, key)
        if st.block is not None and (st.block.header_line is not None or st.block.frames):
            st.chain.append(st.block)
        st.block, st.reading_detail = None, False
        if st.chain:
            self.events.append(Event(st.chain, key, st.first, st.traceback))
        st.chain, st.pending_chain, st.traceback = [], False, False

    def close_loose(self, st: _Stream, key: tuple[str | None, int | None]) -> None:
        """End the loose error ``st`` is reading (with its follow-up lines): it becomes an event."""
        if st.loose:
            self.events.append(Event(st.loose, key, st.loose[0].lines[0].index, False))
        st.loose, st.loose_loc = [], None

    def feed(self, ln: LogLine) -> None:
        """Read the next line of the log."""
        key = ln.stream
        st = self.streams.setdefault(key, _Stream())
        msg = ln.msg
        if st.block is None and st.chain and not st.pending_chain and msg.strip() and not _CHAIN.match(msg):
            self.close_chain(st, key)  # a finished chain: no "The above exception ..." followed its blank line
        if not self._traceback_line(st, key, ln):
            self._loose_line(st, key, ln)

    def finish(self) -> list[Event]:
        """Close what every process is still reading; the events in log order."""
        for key, st in self.streams.items():
            self.close_chain(st, key)
        self.events.sort(key=lambda e: e.first)
        return self.events

    def _traceback_line(self, st: _Stream, key: tuple[str | None, int | None], ln: LogLine) -> bool:
        """Read ``ln`` as part of a traceback's structure; False when it is not (a loose line, maybe)."""
        msg = ln.msg
        if _TB_START.search(msg) or _RAY_START.match(msg.strip()):
            self.close_loose(st, key)
            if st.pending_chain and st.block is not None:
                st.chain.append(st.block)
                st.block = None
            elif st.pending_chain and st.block is None:
                pass
            else:
                self.close_chain(st, key)
                st.first, st.traceback = ln.index, True
            st.pending_chain, st.reading_detail = False, False
            st.block = ExcBlock(lines=[ln])  # Ray's header: the remote frames and exception follow
            return True
        if _CHAIN.match(msg):
            if st.block is not None:
                st.chain.append(st.block)
                st.block = None
            st.pending_chain, st.reading_detail = True, False
            return True
        if st.block is not None:
            return self._block_line(st, st.block, key, ln)
        return False

    def _block_line(self, st: _Stream, block: ExcBlock, key: tuple[str | None, int | None], ln: LogLine) -> bool:
        """Read ``ln`` inside the exception ``block`` (``st.block``): a frame, the lines before the exception
        line, the exception line, its message lines. False when ``ln`` ends the traceback and is not part of it."""
        msg = ln.msg
        fm = _FRAME.match(msg)
        if fm and not st.reading_detail:
            block.frames.append(Frame(fm.group("file"), int(fm.group("line")), fm.group("func")))
            block.lines.append(ln)
            return True
        if fm and st.reading_detail:  # a new traceback without a header: end this one
            self.close_chain(st, key)
            st.first, st.traceback = ln.index, True
            st.block = ExcBlock(lines=[ln], frames=[Frame(fm.group("file"), int(fm.group("line")), fm.group("func"))])
            return True
        if block.exc_type is None and not st.reading_detail:
            self._before_exception(st, block, ln)
            return True
        if st.reading_detail and not msg.strip():  # a blank line: the chain may continue ("The above ...")
            st.chain.append(block)
            st.block, st.reading_detail = None, False
            return True
        if st.reading_detail:
            hdr = block.header_line
            same_header = hdr is not None and (ln.level, ln.loc) == (hdr.level, hdr.loc)
            headerless = ln.level is None
            foreign = headerless and (
                bool(re.match(r"^(\[|\(|INFO|WARNING|DEBUG|nanobind)", msg)) or exception_line(msg) is not None
            )
            if msg.strip() and same_header and not foreign and len(block.detail) < (12 if headerless else 30):
                block.detail.append(msg.strip())
                block.lines.append(ln)
                return True
            self.close_chain(st, key)
            # this line may start a loose event
        return False

    @staticmethod
    def _before_exception(st: _Stream, block: ExcBlock, ln: LogLine) -> None:
        """Read ``ln`` in ``block`` before its exception line: a frame's source line (or caret line), something
        between the header and the frames, or the exception line itself (then its message lines follow)."""
        msg = ln.msg
        if not msg.strip():
            return
        if msg[:1] in (" ", "\t"):  # a source line, caret line or "..." under a frame
            if block.frames and not block.frames[-1].code and not set(msg.strip()) <= set("^~ "):
                f = block.frames[-1]
                block.frames[-1] = Frame(f.file, f.line, f.function, msg.strip())
            block.lines.append(ln)
            return
        exc = exception_line(msg)
        if exc is None and not block.frames and not ERRORISH.search(msg) and ln.level is None:
            block.lines.append(ln)  # something between header and frames: keep reading
            return
        block.exc_type, block.message = exc if exc else (None, msg.strip())
        if exc is None and ":" in msg.strip():  # "SomeThing: message" without an exception-like name
            t, _, rest = msg.strip().partition(":")
            if re.fullmatch(r"[A-Za-z_][\w.]*", t):
                block.exc_type, block.message = t, rest.strip()
        block.header_line = ln
        block.lines.append(ln)
        st.reading_detail = True

    def _loose_line(self, st: _Stream, key: tuple[str | None, int | None], ln: LogLine) -> None:
        """Read ``ln`` outside a traceback: an error line starts a loose event, the lines with its header (or an
        untagged exception line's message lines) continue it, anything else ends it."""
        msg = ln.msg
        if ln.level in ("DEBUG", "INFO", "WARNING") or not msg.strip() or is_progress(msg):
            self.close_loose(st, key)
            return
        exc = exception_line(msg)
        errorish = bool(exc) or bool(ERRORISH.search(msg)) or ln.level in ("ERROR", "CRITICAL")
        # an untagged exception line's own message lines (pydantic's per-field errors, torch's notes)
        if (
            st.loose
            and st.loose_loc == _RAW
            and ln.level is None
            and exc is None
            and not re.match(r"^(\[|\(|INFO|WARNING|DEBUG|nanobind)", msg)
            and len(st.loose[-1].detail) < 12
        ):
            st.loose[-1].detail.append(msg.strip())
            st.loose[-1].lines.append(ln)
            return
        if st.loose and (ln.level, ln.loc) == st.loose_loc and ln.level is not None:
            if exc:  # a logged exception string: a new block of the same event
                st.loose.append(ExcBlock(exc_type=exc[0], message=exc[1], lines=[ln], header_line=ln))
            else:
                st.loose[-1].detail.append(msg.strip())
                st.loose[-1].lines.append(ln)
            return
        self.close_loose(st, key)
        if not errorish:
            return
        blk = ExcBlock(
            exc_type=exc[0] if exc else None, message=exc[1] if exc else msg.strip(), lines=[ln], header_line=ln
        )
        if ln.level is not None:
            st.loose, st.loose_loc = [blk], (ln.level, ln.loc)
        elif exc:
            st.loose, st.loose_loc = [blk], _RAW
        else:
            self.events.append(Event([blk], key, ln.index, False))


def parse_events(text: str) -> tuple[list[LogLine], list[Event]]:
    """Parse ``text`` into lines and failure events (tracebacks and loose error lines), in log order.

    Lines logged at DEBUG/INFO/WARNING are never events, except inside a traceback of their process
    (vLLM logs tracebacks at ERROR; a raw traceback on stderr has no header at all).
    """
    lines = [parse_line(i, raw) for i, raw in enumerate(text.splitlines())]
    parser = _EventParser()
    for ln in lines:
        parser.feed(ln)
    return lines, parser.finish()
