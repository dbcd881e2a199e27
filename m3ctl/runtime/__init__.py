"""Runtimes launch a :class:`~m3ctl.planning.plan.LaunchPlan` and manage what they started.

One interface (:class:`~m3ctl.runtime.base.Runtime`): launch, is_alive, stop, log_text.
``process`` runs ``vllm serve`` as a local process group; ``docker`` runs the plan's image
through the Docker engine (:mod:`m3ctl.runtime.docker`).
"""

from __future__ import annotations

from m3ctl.errors import BadInput
from m3ctl.runtime.base import Runtime


def get_runtime(name: str, options: dict | None = None) -> Runtime:
    """The runtime named ``name``; ``options`` are runtime settings recorded with a deployment
    (docker: :class:`~m3ctl.runtime.docker.DockerOptions` fields).

    Raises:
        BadInput: unknown runtime name.
    """
    if name == "process":
        from m3ctl.runtime.process import ProcessRuntime  # noqa: PLC0415

        return ProcessRuntime()
    if name == "docker":
        from m3ctl.runtime.docker import DockerOptions, DockerRuntime  # noqa: PLC0415

        return DockerRuntime(DockerOptions(**(options or {})))
    raise BadInput(f"unknown runtime {name!r}", "use --runtime process or --runtime docker")
