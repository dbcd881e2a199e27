"""Runtimes launch a :class:`~m3ctl.planning.plan.LaunchPlan` and manage what they started.

One interface (:class:`~m3ctl.runtime.base.Runtime`): launch, is_alive, stop, log_text.
``process`` runs ``vllm serve`` as a local process group; ``docker`` runs the plan's image
through the Docker engine (:mod:`m3ctl.runtime.docker`).
"""

from __future__ import annotations

from m3ctl.core.state import Deployment
from m3ctl.errors import BadInput
from m3ctl.runtime.base import Runtime
from m3ctl.runtime.docker import DockerOptions, DockerRuntime
from m3ctl.runtime.process import ProcessRuntime


def get_runtime(name: str, options: dict | None = None) -> Runtime:
    """The runtime named ``name``; ``options`` are runtime settings recorded with a deployment
    (docker: :class:`~m3ctl.runtime.docker.DockerOptions` fields).

    Raises:
        BadInput: unknown runtime name.
    """
    if name == "process":
        return ProcessRuntime()
    if name == "docker":
        return DockerRuntime(DockerOptions(**(options or {})))
    raise BadInput(f"unknown runtime {name!r}", "use --runtime process or --runtime docker")


def runtime_for(dep: Deployment) -> Runtime:
    """The runtime that manages ``dep``, configured as it was launched (its recorded runtime options).

    Raises:
        BadInput: the record names an unknown runtime.
    """
    return get_runtime(dep.runtime, dep.runtime_options or None)
