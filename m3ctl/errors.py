"""Exception hierarchy and exit codes.

Every error m3ctl raises on purpose is an :class:`M3Error`: a one-line ``message``
saying what was wrong, an optional ``hint`` saying what to do, and an ``exit_code``.
The CLI maps these to ``error: <message>`` / ``hint: <hint>`` on stderr and the exit
code, without a traceback unless ``--debug`` is given.

Exit codes (stable, documented in README.md):

===  =========================================================
0    ok
1    checks failed / run invalid (e.g. doctor found a FAIL, bench had failures)
2    usage or bad input (bad flag value, missing file)
3    configuration rejected before launch (port in use, invalid plan)
4    launch or readiness failed (server died, readiness budget ran out); a bench's server went down or was stopped
     by ``m3ctl stop`` during the run (:class:`BenchServerDown`)
5    results measured and printed, but they could not be saved (disk full, read-only; :class:`WriteFailed`; a
     tune's study record mid-run)
6    nothing answers at the server's URL (connection refused or timed out: :class:`ServerUnreachable`); not a typo
     in the command, so not 2: start the server or point at one that runs
130  interrupted (Ctrl-C; 143 SIGTERM, 129 SIGHUP: m3ctl.core.signals)
===  =========================================================
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_OK = 0
EXIT_CHECKS_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG_REJECTED = 3
EXIT_LAUNCH_FAILED = 4
EXIT_NOT_SAVED = 5
EXIT_UNREACHABLE = 6
EXIT_INTERRUPTED = 130


class M3Error(Exception):
    """Base of all deliberate m3ctl errors.

    Args:
        message: one line naming what was wrong.
        hint: one line naming what to do about it (optional).
    """

    exit_code = EXIT_CHECKS_FAILED

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message


class ChecksFailed(M3Error):
    """A check or a measured run did not pass (exit 1)."""

    exit_code = EXIT_CHECKS_FAILED


class BadInput(M3Error):
    """Usage error or bad input such as a missing file or a malformed value (exit 2)."""

    exit_code = EXIT_USAGE


class CatalogError(BadInput):
    """A YAML profile/image/model file does not match its schema (exit 2)."""


class UnknownSystem(BadInput):
    """A ``--system`` name that is not in the catalog, or a GPU count the node cannot hold (exit 2)."""


class RuleOutcome(Protocol):
    """What :class:`ConfigRejected` keeps of a plan rule's finding (:class:`m3ctl.assess.rules.Finding` is one)."""

    @property
    def rule(self) -> str: ...

    @property
    def message(self) -> str: ...

    @property
    def fix(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def status(self) -> str: ...


class ConfigRejected(M3Error):
    """The launch configuration was rejected before anything started (exit 3).

    A rejection by a plan rule carries that rule's outcome as attributes, so no caller reads the message text
    back (build one with :func:`m3ctl.assess.rules.rejection`).

    Args:
        message: one line; for a rule, ``rule <id>: <reason>``.
        hint: the line shown under it (for a rule: its fix, ``[source: ...]`` and any alternatives).
        rule: id of the rule that rejected the plan (e.g. ``memory.fit``); None when no rule did (a port in use,
            a bad mount); the message text is never read back for it.
        reason: what the rule found, without the ``rule <id>: `` prefix (default: the message without it).
        fix: the rule's fix alone (None when unknown).
        source: where the rule's constraint comes from (None when unknown).
        findings: every FAIL finding of the plan, the rejecting one first (empty when unknown).

    Attributes:
        rule, reason, fix, source, findings: as given (``reason`` is the whole message when ``rule`` is None).
    """

    exit_code = EXIT_CONFIG_REJECTED

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        rule: str | None = None,
        reason: str | None = None,
        fix: str | None = None,
        source: str | None = None,
        findings: Sequence[RuleOutcome] = (),
    ):
        super().__init__(message, hint)
        self.rule = rule
        self.reason = reason if reason is not None else message.removeprefix(f"rule {rule}: " if rule else "")
        self.fix = fix
        self.source = source
        self.findings = tuple(findings)


class LaunchFailed(M3Error):
    """The server could not be started, died, or never became ready (exit 4).

    Attributes:
        phase: readiness phase in which the failure happened (e.g. ``"first_completion"``).
        root_cause: the log line judged to be the root cause, if one was found.
        log_path: path of the server log, if any.
        elapsed_s: seconds from the launch to the failure, when the raiser measured them (a tune trial's start
            time; None otherwise).
        family: the engine component the log's stack names (a ``families`` id of m3ctl/data/components.yaml:
            ``spec-decode``, ``cudagraph``, ``kill`` ...), None when no diagnosis named one.
        exit_status: how the server ended, where the runtime knows (``killed by SIGKILL``, ``exit 1``).
    """

    exit_code = EXIT_LAUNCH_FAILED
    elapsed_s: float | None = None
    family: str | None = None
    exit_status: str | None = None

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        phase: str | None = None,
        root_cause: str | None = None,
        log_path: str | None = None,
    ):
        super().__init__(message, hint)
        self.phase = phase
        self.root_cause = root_cause
        self.log_path = log_path


class StateWriteFailed(ConfigRejected):
    """The state directory could not take a record, a plan or its probe (disk full, read-only): exit 3 before a
    launch; a runtime that has already started a server stops it and raises LaunchFailed instead."""


#: Cause words per errno, as an operator reads them (``strerror`` of the C library, lower case).
_CAUSES = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "is a directory",
    errno.ENOTDIR: "a parent is not a directory",
    errno.EIO: "I/O error",
    errno.ENOENT: "no such directory",
}


def cause(e: OSError) -> str:
    """The cause of ``e`` in words (``no space left on device``), from its errno."""
    return _CAUSES.get(e.errno or 0) or (e.strerror or type(e).__name__).lower()


class WriteFailed(M3Error):
    """A file could not be written (exit 5: results measured and shown, but not saved).

    Attributes:
        path: the file that was not written.
        nbytes: the bytes the write needed.
        errno: the OSError's errno (``errno.ENOSPC``...).
        document: the result that was not saved, for the caller to show or save elsewhere (None: not attached).
        others: further files of the same save that failed too.
    """

    exit_code = EXIT_NOT_SAVED

    def __init__(self, path: Path, nbytes: int, err: OSError, hint: str | None = None):
        self.path, self.nbytes, self.errno, self.cause = Path(path), nbytes, err.errno, cause(err)
        self.document: dict[str, Any] | None = None
        self.others: list[WriteFailed] = []
        space = err.errno in (errno.ENOSPC, errno.EDQUOT)
        super().__init__(
            f"{self.cause} writing {path} ({nbytes:,} bytes needed)",
            hint
            or (
                "free space or choose another path, then rerun"
                if space
                else "choose a path in a directory that exists and that you can write, then rerun"
            ),
        )


class Unauthorised(BadInput):
    """A server answered 401/403: it requires an API key that was not sent (or not that one). Never a dead
    engine: the message names the key source the deployment expects (exit 2)."""


class NotFound(BadInput):
    """A named deployment or file does not exist (exit 2)."""


class UnreadableRecord(NotFound):
    """A deployment record exists but cannot be read (truncated, not JSON, wrong shape).

    Attributes:
        path: the record file.
    """

    def __init__(self, name: str, path: Path, why: str):
        super().__init__(
            f"the record of deployment {name!r} is unreadable ({path}: {why})",
            f"`m3ctl stop {name}` still finds its server by its process marker or container label",
        )
        self.path = path


def plain_text(value: Any) -> Any:
    """``value`` as given, when every string in it (lists, tuples and dict keys and values included) is text a
    command line can carry: the settings models (m3ctl.loadgen.config.BenchConfig,
    m3ctl.assess.request.PlanRequest) run it on every field, so the API refuses what the CLI cannot be given.

    Raises:
        ValueError: bytes (pydantic would decode them silently), or a NUL character (no argv holds one; vLLM,
            a file name or an HTTP header would cut the text there).
    """
    wrong = (
        "bytes are not text: pass a str"
        if isinstance(value, bytes | bytearray)
        else "a NUL character (\\x00) is not allowed in text"
        if isinstance(value, str) and "\x00" in value
        else None
    )
    if wrong:  # a ValueError: pydantic reports it as the field's error (a TypeError would escape it)
        raise ValueError(wrong)
    if isinstance(value, list | tuple | set | frozenset):
        for v in value:
            plain_text(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            plain_text(k)
            plain_text(v)
    return value


class FirstError(NamedTuple):
    """The first error of a pydantic ``ValidationError`` (:func:`first_error`).

    Attributes:
        loc: where it is, as pydantic gives it (field names and list indices; empty for a check across fields).
        msg: what is wrong, without pydantic's ``Value error, `` prefix (a validator's own words).
    """

    loc: tuple[int | str, ...]
    msg: str

    @property
    def where(self) -> str:
        """The location as a dotted path (``systems.h200.gpus``; empty for a check across fields)."""
        return ".".join(str(p) for p in self.loc)

    def __str__(self) -> str:
        """One line: ``where: msg``, or ``msg`` alone when the error has no location."""
        return f"{self.where}: {self.msg}" if self.loc else self.msg


def first_error(e: ValidationError) -> FirstError:
    """The first error of ``e`` (pydantic lists them in field order), to report it in one line: ``str()`` of the
    answer is ``loc.path: message``; ``.loc``, ``.where`` and ``.msg`` give the parts."""
    err = e.errors()[0]
    return FirstError(tuple(err["loc"]), err["msg"].removeprefix("Value error, "))


def argument_error(who: str, name: str, value: Any, msg: str, hint: str) -> BadInput:
    """A bad argument of an API call as one line: ``who(name=value): msg``, the value as given (its repr cut at
    60 characters)."""
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    return BadInput(f"{who}({name}={shown}): {msg}", hint)


class ServerUnreachable(M3Error):
    """Nothing answers at a server's URL before any request was sent: the connection is refused (nothing listens)
    or times out (exit 6). A host name that does not resolve stays :class:`BadInput` (a typo in --url)."""

    exit_code = EXIT_UNREACHABLE


class BenchServerDown(M3Error):
    """The server stopped accepting connections during the run, or ``m3ctl stop`` stopped it (exit 4, as a server
    that died at launch).

    Partial results are kept (``--output-json``); the failures are counted per kind in ``failed_by_kind``.
    """

    exit_code = EXIT_LAUNCH_FAILED


class NothingToTune(ConfigRejected):
    """The plan rules reject every configuration of a tune study's space (exit 3, as any ConfigRejected)."""
