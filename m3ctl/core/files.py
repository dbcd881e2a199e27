"""Files m3ctl writes (results, state) and reads (files a user names): one place for both.

Writes are atomic: the content is rendered in memory first (so its size is known), written to a unique temp
file in the target's directory, flushed and fsync'ed, renamed over the target (``os.replace``: POSIX
``rename(2)`` is atomic within a file system, https://pubs.opengroup.org/onlinepubs/9699919799/functions/rename.html)
and the directory is fsync'ed so the rename itself survives a crash. A failed write (disk full, read-only file
system, no permission, a directory in the way) leaves the old file or none, never a 0-byte or truncated one: the
temp file is removed, and the error names the cause, the path and the bytes it needed.

What m3ctl writes over is only what it may replace: a regular file (replaced atomically, as above, keeping its
permission bits; a new file gets ``open()``'s 0666 less the umask), a symlink
(followed: its target is replaced, the link stays), or a stream a user named on purpose (``/dev/stdout``, a FIFO,
``/dev/null``: a character device or a pipe, written through, never replaced). Anything else (a socket, a block
device) is refused, before the run by :func:`m3ctl.core.state.check_output_path` and again at the write.

Reads of user files (``--config``, a profile, a trace, records) say in one line what is wrong with the file (a
directory, not UTF-8, unreadable) instead of raising a raw ``UnicodeDecodeError``/``IsADirectoryError``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from pathlib import Path
from typing import Literal

from m3ctl.catalog.loader import read_user_text
from m3ctl.errors import WriteFailed, cause

__all__ = ["WriteFailed", "cause", "output_target", "read_user_text", "save_with_fallback", "write_atomic"]

Kind = Literal["new", "regular", "directory", "stream", "other"]


def output_target(path: str | Path) -> tuple[Path, Kind, str]:
    """Where a write to ``path`` lands and what is there: ``(target, kind, what)``. ``target`` is ``path`` with its
    symlinks followed (a dangling link's destination too); ``kind`` is ``new`` (nothing there yet), ``regular``,
    ``directory``, ``stream`` (a character device or a FIFO: written through) or ``other`` (a socket, a block
    device: never written); ``what`` names it in words (``a socket``)."""
    path = Path(path)
    target = path.resolve() if path.is_symlink() else path
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target, "new", "a new file"
    except (OSError, ValueError):
        return target, "regular", "a file"  # unreadable metadata: the write itself names the cause
    if stat.S_ISREG(mode):
        return target, "regular", "a file"
    if stat.S_ISDIR(mode):
        return target, "directory", "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return target, "stream", "a character device" if stat.S_ISCHR(mode) else "a FIFO"
    return (
        target,
        "other",
        "a socket" if stat.S_ISSOCK(mode) else "a block device" if stat.S_ISBLK(mode) else "not a file",
    )


def _write_through(target: Path, blob: bytes) -> None:
    """Write ``blob`` into a stream (a character device or a FIFO) as it is: no temp file, no rename."""
    with open(target, "wb") as f:
        f.write(blob)
        f.flush()


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems (and Windows) cannot open a directory: best effort
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _mode(path: Path) -> int | None:
    """``path``'s mode, or None where its metadata cannot be read (the write itself then names the cause)."""
    try:
        return os.stat(path).st_mode
    except (OSError, ValueError):
        return None


def _temp_beside(path: Path, mode: int | None) -> tuple[int, str]:
    """A new unique temp file next to ``path``, open for writing: ``(fd, name)``. Its mode is what the file will
    keep once renamed over ``path``: ``mode``'s permission bits (the file it replaces: a 0644 result stays 0644, a
    0755 script 0755), else what ``open(path, "w")`` gives a new file (0666 less the umask, applied by the kernel;
    ``tempfile.mkstemp``'s private 0600 would make every result unreadable to the user's group)."""
    for _ in range(100):
        name = str(path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        if mode is not None:
            try:
                os.fchmod(fd, stat.S_IMODE(mode))
            except OSError:
                os.close(fd)
                os.unlink(name)
                raise
        return fd, name
    raise FileExistsError(errno.EEXIST, "no unique temp file name", str(path.parent))


def write_atomic(path: str | Path, data: str | bytes, *, mkdir: bool = True) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically: a unique temp file in the same directory, write,
    flush, fsync, rename over ``path``, fsync the directory. Two writers never share a temp file.

    A symlink is followed (its target is replaced; the link stays); a character device or a FIFO (``/dev/stdout``,
    ``/dev/null``, a pipe) is written through, never replaced (:func:`output_target`).

    Returns:
        ``path``.

    Raises:
        WriteFailed: any OSError (ENOSPC, EDQUOT, EROFS, EACCES, EISDIR, ...): ``path`` is untouched (the old file
            or none) and no temp file is left; ``path`` is a socket or a block device (EINVAL: m3ctl replaces
            only regular files).
    """
    given = Path(path)
    blob = data.encode() if isinstance(data, str) else bytes(data)
    tmp = None
    try:
        path, kind, what = output_target(given)
        if kind == "directory":
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if kind == "other":
            raise OSError(errno.EINVAL, f"{what}, not a regular file: m3ctl writes only files it may replace")
        if kind == "stream":
            _write_through(path, blob)
            return given
        if mkdir:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except FileExistsError:  # a component of the parent is a file
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path.parent)) from None
        fd, tmp = _temp_beside(path, _mode(path) if kind == "regular" else None)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(path.parent)
        return given
    except OSError as e:
        raise WriteFailed(given, len(blob), e) from None
    except ValueError as e:  # a NUL byte in the path
        raise WriteFailed(given, len(blob), OSError(errno.EINVAL, f"invalid path ({e})")) from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def save_with_fallback(path: str | Path, data: str | bytes, fallback_dir: Path, what: str) -> Path:
    """:func:`write_atomic` to ``path``; when that fails, to ``fallback_dir/<time>-<name>`` (the results are kept
    if they can be written whole anywhere).

    Returns:
        The path written (the fallback's when ``path`` failed).

    Raises:
        WriteFailed: both failed; its message names the cause at ``path``, and the fallback's if it differed.
    """
    path = Path(path)
    try:
        return write_atomic(path, data)
    except WriteFailed as first:
        fallback = Path(fallback_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{path.name or what}"
        try:
            return write_atomic(fallback, data)
        except WriteFailed as second:
            extra = "" if second.cause == first.cause else f": {second.cause}"
            first.hint = (
                f"nothing was saved (the fallback copy under {fallback_dir} failed too{extra}); free "
                "space or choose another path, then rerun"
            )
            raise first from None
