"""The prewarmed server process (run by file path, standard library only: the vLLM interpreter need not have m3ctl).

``python prewarm_child.py SPEC_JSON`` where SPEC_JSON is ``{"imports": [module, ...], "run": {"path": FILE} |
{"module": NAME}}``:

1. imports every module of ``imports`` (a module that fails is reported on stderr and skipped: the entry script
   imports what it needs itself);
2. prints ``m3ctl prewarm: ready`` and waits for one JSON line on stdin: ``{"argv": [...], "env": {...},
   "log": PATH}``; end of input (the parent went away) exits 0 without running anything;
3. points stdout and stderr at ``log`` (append), stdin at /dev/null, replaces its environment with ``env`` and
   ``sys.argv`` with ``argv``, and runs the entry script as ``__main__`` (``runpy.run_path``: a pip console script
   such as ``vllm``) or the module (``runpy.run_module``: a ``exec python -m vllm.entrypoints.cli.main "$@"``
   wrapper). Its exit status is the entry script's.

The server is the same program with the same arguments and environment as ``vllm serve ...`` started directly; only
its imports happened before the launch (m3ctl.runtime.prewarm).
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys

READY = "m3ctl prewarm: ready"


def _redirect(log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def main() -> int:
    spec = json.loads(sys.argv[1])
    for mod in spec.get("imports", []):
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any import failure only means less was imported ahead
            print(f"m3ctl prewarm: import {mod} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    print(READY, flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    go = json.loads(line)
    _redirect(go["log"])
    os.environ.clear()
    os.environ.update(go["env"])
    sys.argv = list(go["argv"])
    run = spec["run"]
    if "module" in run:
        runpy.run_module(run["module"], run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(run["path"], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
