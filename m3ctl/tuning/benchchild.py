"""One bench run in its own Python process, for trials that measure side by side (m3ctl.tuning.server.run_bench_isolated).

``python -m m3ctl.tuning.benchchild IN OUT``: IN holds the pickled ``(BenchConfig, Deployment)``; OUT receives the pickled
``{"result": dict}`` or ``{"error": "BadInput" | "ServerUnreachable" | "BenchServerDown", "message", "hint"}``, or ``{"interrupted": signum}``
(a signal before the measured phase: nothing measured). Signals: :func:`m3ctl.core.signals.first_signal_only` (the
first ends the run as in any bench, what finished kept as ``interrupted``; the parent's forward of a signal that
reached the whole group too is ignored). A process of its own because
m3ctl.loadgen.runner allows one run per process (its stall tracker and progress sink are process-wide); a fresh
interpreter rather than a fork of the multi-threaded tune process or a multiprocessing child (which would import the
caller's ``__main__`` script again).
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

from m3ctl.core import signals
from m3ctl.errors import BadInput, ServerUnreachable
from m3ctl.loadgen.runner import BenchServerDown, run_bench
from m3ctl.serving.serve import runtime_for


def main(inp: str, out: str) -> int:

    res: dict = {"interrupted": None}
    with signals.first_signal_only():
        try:
            cfg, dep = pickle.loads(Path(inp).read_bytes())
            res = {"result": run_bench(cfg, sync_log=lambda: runtime_for(dep).sync_log(dep))}
        except BenchServerDown as e:
            res = {"error": "BenchServerDown", "message": e.message, "hint": e.hint}
        except ServerUnreachable as e:
            res = {"error": "ServerUnreachable", "message": e.message, "hint": e.hint}
        except BadInput as e:
            res = {"error": "BadInput", "message": e.message, "hint": e.hint}
        except KeyboardInterrupt as e:  # before the measured phase: nothing was measured
            res = {"interrupted": signals.signum_of(e)}
    with signals.sigint_ignored():  # the result is written whole
        Path(out).write_bytes(pickle.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
