"""Prewarmed server processes for the process runtime: the next ``vllm serve`` with its imports already done.

A tuning study starts one server per trial, and every start of ``vllm serve`` spends about 19 s importing vLLM and
torch before it reads its first argument (H200, vLLM 0.26: docs/results/h200-starts.md). A prewarmed process
(m3ctl/runtime/prewarm_child.py) is the same Python interpreter the ``vllm`` entry script runs under, started
ahead of time with the launch's environment; it imports the modules listed in m3ctl/data/startup.yaml
(``prewarm.imports``), then waits. :meth:`m3ctl.runtime.process.ProcessRuntime.launch` hands a waiting process
whose environment and entry script equal the launch's its command line instead of starting a new one
(:func:`claim`), so the server that runs is the one ``vllm serve ...`` would start, with its imports done.

Who uses it: ``m3ctl tune`` (its start measures, m3ctl.tuning.startup), which keeps one process waiting per trial slot
while a trial starts (:func:`ensure`). A waiting process that is not claimed is ended by :func:`discard`; one whose
parent died reads end of input and exits. A waiting process carries the state dir's marker (m3ctl.core.state.MARKER_ENV)
under its own name (``<prefix>-warmN``), so ``m3ctl status`` shows it and ``m3ctl stop --all`` ends it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from m3ctl.catalog.startup import facts
from m3ctl.core.state import MARKER_ENV, Registry

CHILD = Path(__file__).with_name("prewarm_child.py")


@dataclass
class Warm:
    """One waiting process.

    Attributes:
        proc: the process (its stdin is the pipe :func:`claim`'s caller writes the launch to).
        key: :func:`launch_key` of the launch it can serve.
        name: its name in the state dir (``<prefix>-warmN``); ``marker`` is its MARKER_ENV value.
        log: where it writes until it is claimed (its import messages).
        created: UNIX time it was started (s).
    """

    proc: subprocess.Popen
    key: str
    name: str
    marker: str
    log: Path
    created: float

    def alive(self) -> bool:
        return self.proc.poll() is None


_LOCK = threading.Lock()
_WAITING: list[Warm] = []
_SEQ = itertools.count(1)


def entry(executable: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """How to run the ``vllm`` entry script ``executable`` in a prewarmed process.

    Returns:
        ``(interpreter argv, run)`` with ``run`` ``{"path": FILE}`` (a Python entry script: its shebang names a
        Python interpreter) or ``{"module": NAME}`` (a shell wrapper ``exec PYTHON -m NAME "$@"`` or ``exec PYTHON FILE.py "$@"``: the
        ``prewarm.wrapper`` pattern of m3ctl/data/startup.yaml); or a string saying why it cannot be prewarmed.
    """
    path = executable if os.sep in executable else shutil.which(executable, path=env.get("PATH"))
    if not path:
        return f"{executable} is not on PATH"
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    if not head.startswith("#!"):
        return f"{path} is not a script"
    shebang = head.splitlines()[0][2:].split()
    if shebang and Path(shebang[0]).name == "env":
        shebang = [a for a in shebang[1:] if not a.startswith("-")]
    if not shebang:
        return f"{path} has an empty #! line"
    if Path(shebang[0]).name.startswith("python"):
        return shebang, {"path": path}
    m = re.search(facts().prewarm.wrapper, head)
    if m is None:
        return f'{path} runs {shebang[0]}, not Python, and is not an `exec PYTHON -m MODULE "$@"` wrapper'
    py = m["python"] if os.sep in m["python"] else shutil.which(m["python"], path=env.get("PATH"))
    if not py:
        return f"{m['python']} (from {path}) is not on PATH"
    return [py], ({"module": m["module"]} if m["module"] else {"path": m["script"]})


def runs_vllm(run: dict[str, str]) -> bool:
    """True when the entry is vLLM's own (a ``vllm.*`` module, or a script that imports vllm): only then are
    vLLM's modules imported ahead (another program, such as a test double, gets a bare interpreter)."""
    if "module" in run:
        return run["module"].split(".")[0] == "vllm"
    try:
        text = Path(run["path"]).read_text(errors="replace")
    except OSError:
        return False
    return re.search(r"^\s*(?:from|import)\s+vllm\b", text, re.MULTILINE) is not None


def launch_key(argv0: str, env: dict[str, str], state_dir: str = "") -> str:
    """What a prewarmed process must match to serve a launch: the state dir it is marked in, the entry script and
    the whole environment, less the marker (every server has its own) and the variables read only after the
    hand-over (``prewarm.late_env`` of m3ctl/data/startup.yaml). A digest, so no secret value is kept in the key."""
    late = {MARKER_ENV, *facts().prewarm.late_env}
    body = json.dumps([state_dir, argv0, sorted((k, v) for k, v in env.items() if k not in late)])
    return hashlib.sha256(body.encode()).hexdigest()


def _spawn(argv0: str, env: dict[str, str], registry: Registry, name: str, key: str) -> Warm | str:
    how = entry(argv0, env)
    if isinstance(how, str):
        return how
    interp, run = how
    log = registry.log_path(name)
    marker = registry.marker(name)
    spec = json.dumps({"imports": facts().prewarm.imports if runs_vllm(run) else [], "run": run})
    with open(log, "wb") as fh:
        try:
            proc = subprocess.Popen(
                [*interp, str(CHILD), spec],
                stdin=subprocess.PIPE,
                stdout=fh,
                stderr=subprocess.STDOUT,
                env={**env, MARKER_ENV: marker},
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            return f"cannot start {interp[0]}: {e.strerror}"
    return Warm(proc, key, name, marker, log, time.time())


def ensure(argv0: str, env: dict[str, str], registry: Registry, prefix: str, keep: int = 2) -> str:
    """Keep ``keep`` processes waiting for launches of ``argv0`` with ``env`` (one for the launch that follows,
    one importing for the launch after it). Waiting processes of ``prefix`` with another key are ended first (the
    study moved to another environment). Returns a note: how many wait, or why none can."""
    key = launch_key(argv0, env, str(registry.root))
    with _LOCK:
        for w in [w for w in _WAITING if w.name.startswith(prefix) and (w.key != key or not w.alive())]:
            _end(w)
        mine = [w for w in _WAITING if w.key == key]
        while len(mine) < keep:
            name = f"{prefix}{os.getpid()}-{next(_SEQ)}"
            spawned = _spawn(argv0, env, registry, name, key)
            if isinstance(spawned, str):
                return f"no prewarmed process: {spawned}"
            _WAITING.append(spawned)
            mine.append(spawned)
    return f"{len(mine)} prewarmed process(es) waiting"


def claim(argv0: str, env: dict[str, str], registry: Registry) -> Warm | None:
    """The oldest live waiting process that can serve this launch (same state dir, entry script and environment),
    taken out of the pool; None if there is none."""
    key = launch_key(argv0, env, str(registry.root))
    with _LOCK:
        for w in sorted(_WAITING, key=lambda w: w.created):
            if w.key == key:
                _WAITING.remove(w)
                if w.alive():
                    return w
                w.log.unlink(missing_ok=True)
    return None


def hand_over(w: Warm, argv: list[str], env: dict[str, str], log: Path) -> None:
    """Give ``w`` its launch: the command line, the environment (its own marker) and the server log. Raises
    OSError when the process is gone."""
    assert w.proc.stdin is not None
    w.proc.stdin.write(
        (json.dumps({"argv": argv, "env": {**env, MARKER_ENV: w.marker}, "log": str(log)}) + "\n").encode()
    )
    w.proc.stdin.close()
    w.log.unlink(missing_ok=True)


def _end(w: Warm) -> None:
    if w in _WAITING:
        _WAITING.remove(w)
    if w.alive():
        try:
            assert w.proc.stdin is not None
            w.proc.stdin.close()  # end of input: it exits without running anything
            w.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            w.proc.kill()
            w.proc.wait(timeout=5)
    w.log.unlink(missing_ok=True)


def discard(prefix: str = "") -> int:
    """End every waiting process whose name starts with ``prefix`` (all of them by default); returns how many."""
    with _LOCK:
        gone = [w for w in _WAITING if w.name.startswith(prefix)]
        for w in gone:
            _end(w)
    return len(gone)


def waiting() -> list[Warm]:
    """The processes waiting now (a copy)."""
    with _LOCK:
        return list(_WAITING)
