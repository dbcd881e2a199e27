"""Runtimes launch a :class:`~m3ctl.plan.LaunchPlan` and manage what they started.

One interface (:class:`~m3ctl.runtime.base.Runtime`): launch, is_alive, stop, log_text.
``process`` runs ``vllm serve`` as a local process group; ``docker`` (its own issue)
runs the plan's image through the Docker engine.
"""

from __future__ import annotations

from m3ctl.errors import BadInput
from m3ctl.runtime.base import Runtime


def get_runtime(name: str) -> Runtime:
    """The runtime named ``name``.

    Raises:
        BadInput: unknown runtime name.
    """
    if name == "process":
        from m3ctl.runtime.process import ProcessRuntime  # noqa: PLC0415

        return ProcessRuntime()
    raise BadInput(f"unknown or unavailable runtime {name!r}", "use --runtime process")
