"""The launch spec: one structured description of a server launch, built once from a
:class:`~m3ctl.planning.plan.LaunchPlan` by :func:`launch_spec`, and rendered (never parsed back) into every form:
the process runtime's argv, the docker SDK kwargs (:mod:`m3ctl.runtime.docker`), and the emitted
``docker run``/compose/k8s/LWS/script/Ray texts (:mod:`m3ctl.planning.emit`).

Shapes:

- :class:`Layout`: the parallel layout (TP, PP, DP, DCP, PCP, EP, DBO, nodes); ``num_gpus`` = TP x PP x DP x PCP
  (DCP reuses the TP GPUs: vLLM "Context parallel" docs, docs.vllm.ai/en/latest/serving/context_parallel_deployment.html).
- :class:`ContainerSpec`: image, vendor device request (UUIDs or indices; empty = all), a read-only mount of the
  model directory and a mount of the HF cache (``HF_HUB_CACHE``, else ``HF_HOME``, else ``~/.cache/huggingface``:
  huggingface_hub "Environment variables", huggingface.co/docs/huggingface_hub/package_reference/environment_variables),
  read-write for a hub model so the engine can download it into the host's cache (as vLLM's docker example mounts
  it: docs.vllm.ai/en/latest/deployment/docker.html), read-only for a local model or an offline plan (and then only
  when it exists),
  environment (non-secret values; secret names passed through), ipc, port, labels, restart policy ``no``.
- :class:`LaunchSpec`: model, served names, typed vLLM flags, env, secret names, layout, container.

Secrets never appear in a spec: ``secret_env_names`` lists the variables the server receives from the
environment of whoever launches it (``VLLM_API_KEY`` for an API key: vLLM reads it when ``--api-key`` is
absent, vllm/entrypoints/serve/middleware/register.py).
"""

import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

from m3ctl import __version__
from m3ctl.catalog import vendors
from m3ctl.catalog.vllm_args import flag_table, vllm_int
from m3ctl.errors import BadInput, ConfigRejected

#: Where the HF cache is mounted inside a container (the official images run as root).
CONTAINER_HF_HOME = "/root/.cache/huggingface"
#: The HF cache of a catalog system's host (``plan --system``: nothing of this machine is read): huggingface_hub's
#: default for root, who runs a GPU node's containers (https://huggingface.co/docs/huggingface_hub/guides/manage-cache).
TARGET_HF_HOME = "/root/.cache/huggingface"
#: Environment variables that select GPUs for a process (every vendor's, m3ctl/data/vendors.yaml); a container gets
#: its devices from the engine instead.
VISIBILITY_ENV = vendors.process_visibility_vars()


class _Model(BaseModel):
    """The base of this module's models: each builds its validator on first use (``defer_build``); ``m3ctl plan``
    prints a plan without building any of them."""

    model_config = ConfigDict(defer_build=True)


class Layout(_Model):
    """Parallel layout of one deployment (sizes >= 1; ``nodes`` >= 1)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    dcp: int = 1
    pcp: int = 1
    ep: bool = False
    dbo: bool = False
    nodes: int = 1

    @property
    def num_gpus(self) -> int:
        """GPUs the server uses: TP x PP x DP x PCP (DCP adds none)."""
        return self.tp * self.pp * self.dp * self.pcp


class Mount(_Model):
    """A bind mount: host ``source`` at ``target`` in the container; ``kind`` says what it carries."""

    source: str
    target: str
    read_only: bool = True
    kind: Literal["model", "hf-cache", "extra"] = "extra"

    def docker_cli(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


class Devices(_Model):
    """GPUs a container sees: ``vendor`` None = none (CPU); ``ids`` empty with a vendor = all of them."""

    vendor: Literal["nvidia", "amd"] | None = None
    ids: list[str] = Field(default_factory=list)


class ContainerSpec(_Model):
    """Everything a container engine needs for the launch (no secret values)."""

    image: str
    name: str
    entrypoint: list[str] = Field(default_factory=lambda: ["vllm"])
    command: list[str]
    """``serve MODEL --host 0.0.0.0 --port N ...``: the server listens on every interface inside its own network
    namespace (a pod; a bridge network publishing only the plan's address)."""
    host_command: list[str] = Field(default_factory=list)
    """``serve MODEL --host <plan host> ...``: sharing the host's network (``--network host``, what ``serve
    --runtime docker`` does), the server listens only where the plan says (127.0.0.1 unless ``--host``)."""
    devices: Devices = Field(default_factory=Devices)
    mounts: list[Mount] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    secret_env_names: list[str] = Field(default_factory=list)
    ipc: Literal["host"] = "host"
    port: int
    user: str | None = None
    restart: Literal["no"] = "no"
    labels: dict[str, str] = Field(default_factory=dict)


class LaunchSpec(_Model):
    """The structured launch of one plan; see the module docstring."""

    name: str
    runtime: str
    model: str
    served_model_names: list[str]
    host: str
    port: int
    vllm_args: dict[str, Any] | None
    """Typed ``vllm serve`` flags (``{flag: value}``, rendered by :func:`render_flags`); None for a
    plan saved before flags were kept typed (its argv is then used as recorded)."""
    legacy_argv: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    unset_env: list[str] = Field(default_factory=list)
    secret_env_names: list[str] = Field(default_factory=list)
    layout: Layout
    startup_budget_s: float
    weights_gib: float | None = None
    offline: bool = False
    container: ContainerSpec | None = None

    def serve_args(self, host: str | None = None) -> list[str]:
        """``serve MODEL --host H --port P --served-model-name N... FLAGS``, listening on ``host`` (default: the plan's)."""
        if self.vllm_args is None:
            args = list(self.legacy_argv[1:])
            if host is not None and "--host" in args[:-1]:
                args[args.index("--host") + 1] = host
            return args
        return serve_command(self.model, host or self.host, self.port, self.served_model_names, self.vllm_args)

    def argv(self, executable: str = "vllm", host: str | None = None) -> list[str]:
        """The full command line with ``executable`` as argv[0]."""
        return [executable, *self.serve_args(host)]


def render_flags(args: dict[str, Any]) -> list[str]:
    """Render ``{flag: value}`` into ``vllm serve`` arguments.

    ``True`` -> ``--flag``; ``False`` -> ``--no-flag`` (accepted by vLLM 0.32 and 0.33, which rejects
    ``--disable-X``: docs/sources.md#cpu-flag-spellings); ``None`` -> omitted; tuples -> one token per
    value (``nargs="+"`` flags); dicts/lists -> JSON.
    Dotted keys (``attention_config.backend``) keep their underscores, as vLLM spells them.
    """
    out: list[str] = []
    for key, val in args.items():
        k = key.lstrip("-")
        flag = "--" + (k if "." in k else k.replace("_", "-"))
        if val is None:
            continue
        if val is True:
            out.append(flag)
        elif val is False:
            out.append("--no-" + flag[2:])
        elif isinstance(val, tuple):  # a flag of several values (nargs="+"): --served-model-name a b
            out += [flag, *(str(v) for v in val)]
        elif isinstance(val, dict | list):
            out += [flag, json.dumps(val, separators=(",", ":"))]
        else:
            out += [flag, str(val)]
    return out


def serve_command(model: str, host: str, port: int, served: list[str], args: dict[str, Any]) -> list[str]:
    """``serve MODEL --host H --port P --served-model-name N [ALIAS...] FLAGS`` (argv without the executable)."""
    return ["serve", model, "--host", host, "--port", str(port), "--served-model-name", *served, *render_flags(args)]


def hf_cache_mount(environ: dict[str, str] | None = None, *, read_only: bool = False) -> Mount:
    """The host HF cache as huggingface_hub resolves it, mounted where the container's hub looks: read-write (the
    engine downloads a hub model into it), or read-only with ``read_only`` (an offline plan reads it only).

    ``HF_HUB_CACHE`` (the hub directory itself; the older ``HUGGINGFACE_HUB_CACHE`` when it is unset) ->
    ``/root/.cache/huggingface/hub``; else ``HF_HOME`` or ``~/.cache/huggingface`` -> ``/root/.cache/huggingface``.
    """
    env = os.environ if environ is None else environ
    # huggingface_hub/constants.py: HF_HUB_CACHE, else the older HUGGINGFACE_HUB_CACHE, else HF_HOME/hub
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if hub:
        return Mount(
            source=str(Path(hub).expanduser().resolve()),
            target=f"{CONTAINER_HF_HOME}/hub",
            kind="hf-cache",
            read_only=read_only,
        )
    home = Path(env["HF_HOME"]).expanduser() if env.get("HF_HOME") else Path.home() / ".cache" / "huggingface"
    return Mount(source=str(home.resolve()), target=CONTAINER_HF_HOME, kind="hf-cache", read_only=read_only)


def parse_mount(spec: str) -> Mount:
    """``HOST:CONTAINER[:ro|rw]`` -> :class:`Mount` (read-only unless ``rw``).

    Raises:
        ConfigRejected: malformed.
    """

    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1] or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ConfigRejected(f"bad mount {spec!r}", "use HOST:CONTAINER[:ro|rw]")
    return Mount(
        source=str(Path(parts[0]).expanduser().resolve()),
        target=parts[1],
        read_only=len(parts) == 2 or parts[2] == "ro",
    )


def _int(v: Any) -> int:

    n = v if isinstance(v, int) else vllm_int(str(v))
    return n if isinstance(n, int) and n >= 1 else 1


def _typed(args: dict[str, Any]) -> dict[str, Any]:
    """Flags of several values (``nargs="+"``) as tuples again after a JSON round trip (a saved plan)."""

    flags = flag_table().flags
    return {
        k: tuple(v) if isinstance(v, list) and k in flags and flags[k].arity == "many" else v for k, v in args.items()
    }


def container_gpus(vendor: str | None, ids: list[str], env: dict[str, str]) -> tuple[Devices, dict[str, str]]:
    """The devices a container of ``vendor`` gets for the GPUs ``ids`` (empty = all), and ``env`` without the
    process visibility variables: a vendor whose engine takes a device request (NVIDIA) gets the ids there; one
    whose container sees every device node (AMD) gets its one visibility variable inside instead (F05).
    Facts: m3ctl/data/vendors.yaml (:mod:`m3ctl.catalog.vendors`)."""
    f = vendors.facts(vendor)
    out = {k: v for k, v in env.items() if k not in VISIBILITY_ENV}
    if f is None:
        return Devices(), out
    var = f.container.visibility_env.value
    if var and ids:
        out[var] = ",".join(ids)
    # Devices validates the vendor name (one of its Literal) as the constructor would.
    return Devices.model_validate({"vendor": vendor, "ids": list(ids) if f.container.device_request.value else []}), out


def launch_spec(plan, *, nodes: int = 1, environ: dict[str, str] | None = None) -> LaunchSpec:
    """Build the :class:`LaunchSpec` of ``plan`` (a :class:`~m3ctl.planning.plan.LaunchPlan`). Pure apart from reading
    where the HF cache is (``environ``, default ``os.environ``) and whether the model is a local directory; a plan
    for a catalog system (``plan.target_system``) reads neither: its HF cache is the target's default
    (:data:`TARGET_HF_HOME`) and its model a hub id or a path on the target."""
    if getattr(plan, "target_system", None):
        environ = {"HF_HOME": TARGET_HF_HOME}

    args = plan.vllm_args
    layout = Layout(
        tp=plan.tp,
        dp=plan.dp,
        dcp=plan.dcp,
        ep=plan.ep,
        dbo=plan.dbo,
        nodes=max(1, nodes),
        pp=_int(args.get("pipeline-parallel-size", 1)) if args else 1,
        pcp=_int(args.get("prefill-context-parallel-size", 1)) if args else 1,
    )
    served = [plan.served_model_name, *[a for a in plan.served_model_aliases if a != plan.served_model_name]]
    spec = LaunchSpec(
        name=plan.name,
        runtime=plan.runtime,
        model=plan.model,
        served_model_names=served,
        host=plan.host,
        port=plan.port,
        vllm_args=_typed(args) if args is not None else None,
        legacy_argv=list(plan.argv) if args is None else [],
        env=dict(plan.env),
        unset_env=list(plan.unset_env),
        secret_env_names=list(plan.secret_env_names),
        layout=layout,
        startup_budget_s=plan.startup_budget_s,
        weights_gib=plan.weights_gib,
        offline=bool(plan.offline),
    )
    if plan.image:
        mounts: list[Mount] = []
        # read-write only where the engine may download: a hub model, not offline (else read-only, if present)
        downloads = not plan.offline and not Path(plan.model).expanduser().is_dir()
        mounts.append(hf_cache_mount(environ, read_only=not downloads))
        for local in [plan.model, *plan.local_paths]:  # the model (tokenizer, draft) directories, read-only
            d = Path(local).expanduser()
            if d.is_dir():
                d = d.resolve()
                if d.parent.name == "snapshots":  # an HF cache snapshot: its files link into ../../blobs
                    d = d.parent.parent
                mounts.insert(len(mounts) - 1, Mount(source=str(d), target=str(d), kind="model"))
        for extra in plan.mounts:
            m = parse_mount(extra)
            if all(m.target != x.target for x in mounts):
                mounts.append(m)
        devices, env = container_gpus(plan.gpu_vendor, plan.gpu_devices, plan.env)
        labels = {
            "m3ctl.name": plan.name,
            "m3ctl.model": plan.model,
            "m3ctl.served-model-name": served[0],
            "m3ctl.port": str(plan.port),
            "m3ctl.plan-hash": plan.plan_hash(),
            "m3ctl.runtime-version": __version__,
        }
        spec.container = ContainerSpec(
            image=plan.image,
            name=f"m3ctl-{plan.name}",
            command=spec.serve_args("0.0.0.0"),
            host_command=spec.serve_args(),
            devices=devices,
            mounts=mounts,
            env=env,
            secret_env_names=list(plan.secret_env_names),
            port=plan.port,
            labels=labels,
        )
    return spec


_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def check_host(host: str) -> str:
    """Validate an API listen address: an IPv4/IPv6 address or an RFC 1123 host name.

    Raises:
        BadInput: anything else (e.g. ``999.1.1.1``, ``local host``, ``http://x``).
    """

    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if _HOSTNAME.match(host) and not host.replace(".", "").isdigit():
        return host
    raise BadInput(f"invalid --host {host!r}", "use an IP address (127.0.0.1, 0.0.0.0, ::) or a host name")


#: Default RPC port of vLLM's multi-node data parallel coordinator (``--data-parallel-rpc-port``).
DP_RPC_PORT = 13345


def multinode_dp_args(
    spec: LaunchSpec,
    nodes: int,
    address: str,
    start_rank: int | str | None = None,
    rpc_port: int = DP_RPC_PORT,
    host: str = "0.0.0.0",
) -> list[str]:
    """``serve ...`` arguments of one node of a multi-node data parallel deployment: ``nodes`` nodes of the plan's
    DP (per node, ``--data-parallel-size-local``), ``--data-parallel-size`` = DP x nodes. ``start_rank`` None is the
    leader (it serves the API; no start rank, which vLLM would read as hybrid/external load balancing); a worker is
    ``--headless`` with ``--data-parallel-start-rank`` = node index x DP (an int, or a shell expression).
    Source: docs.vllm.ai/en/latest/serving/data_parallel_deployment.html; checked end to end with vLLM 0.32 CPU,
    two nodes on 127.0.0.1 (tests/integration/test_multinode.py).

    Raises:
        BadInput: fewer than 2 nodes, or a spec without typed flags (a plan saved before they were kept).
    """

    if nodes < 2:
        raise BadInput(f"{nodes} node(s): multi-node data parallel needs at least 2", "use a single-node form")
    if spec.vllm_args is None:
        raise BadInput("this saved plan has no typed vLLM flags", "plan it again to emit multi-node forms")
    dp_local = max(1, spec.layout.dp)
    args = {k: v for k, v in spec.vllm_args.items() if k != "data-parallel-size"}
    args.update(
        {
            "data-parallel-size": dp_local * nodes,
            "data-parallel-size-local": dp_local,
            "data-parallel-address": address,
            "data-parallel-rpc-port": rpc_port,
        }
    )
    if start_rank is not None:
        args.update({"headless": True, "data-parallel-start-rank": start_rank})
    return serve_command(spec.model, host, spec.port, spec.served_model_names, args)


# ------------------------------------------------------------------ the one docker launch
class GpuRequest(_Model):
    """A Docker device request (``--gpus``; SDK ``DeviceRequest``): ``ids`` empty = all GPUs (``Count -1``)."""

    driver: str = ""
    ids: list[str] = Field(default_factory=list)
    capabilities: list[list[str]] = Field(default_factory=lambda: [["gpu"]])


class PortMap(_Model):
    """``-p HOST_IP:HOST_PORT:CONTAINER_PORT`` (bridge network only)."""

    host_ip: str
    host_port: int
    container_port: int


class Ulimit(_Model):
    name: str
    soft: int
    hard: int


class DockerRun(_Model):
    """The one container a docker launch creates: ``docker run`` (:meth:`cli_args`, what ``serve`` prints and
    ``plan --emit docker`` writes) and the docker SDK's ``containers.run`` kwargs (:meth:`sdk_kwargs`, what the
    docker runtime sends) are both rendered from it, so the printed command is the created container. Built by
    :func:`docker_run`. Secret values never enter it: ``secret_env_names`` only (``docker run -e NAME`` reads the
    value from the caller's environment; the SDK gets it from the launch's secret environment)."""

    name: str
    image: str
    entrypoint: list[str]
    command: list[str]
    network: Literal["host", "bridge"] = "host"
    ports: list[PortMap] = Field(default_factory=list)
    ipc: Literal["host"] | None = "host"
    shm_size: str | None = None
    ulimits: list[Ulimit] = Field(default_factory=list)
    mounts: list[Mount] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    secret_env_names: list[str] = Field(default_factory=list)
    gpus: GpuRequest | None = None
    devices: list[str] = Field(default_factory=list)
    """Host device nodes, passed at the same path with ``rwm`` (``--device PATH``)."""
    groups: list[str] = Field(default_factory=list)
    security_opt: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    restart: Literal["no"] = "no"
    user: str | None = None

    def _gpus_cli(self) -> str:
        """The ``--gpus`` value as the docker CLI reads it (a CSV record, docker/cli opts/gpus.go): a list of
        devices is one quoted CSV field (``"device=0,1"``), else the CLI would split it."""
        g = self.gpus
        assert g is not None
        fields = [f"driver={g.driver}"] if g.driver else []
        fields.append(f'"device={",".join(g.ids)}"' if g.ids else ("count=all" if fields else "all"))
        if g.capabilities != [["gpu"]]:
            raise ValueError(f"capabilities {g.capabilities} have no docker run form here")
        return ",".join(fields)

    def cli_args(self, *, detach: bool = True) -> list[str]:
        """``docker run`` argv (as the docker CLI receives it); ``detach`` False runs it in the foreground
        (``--rm``)."""
        cmd = ["docker", "run", *(["-d"] if detach else ["--rm"]), "--name", self.name]
        if self.ipc:
            cmd.append(f"--ipc={self.ipc}")
        cmd += ["--restart", self.restart]
        if self.network == "host":
            cmd += ["--network", "host"]
        for p in self.ports:
            ip = f"[{p.host_ip}]" if ":" in p.host_ip else p.host_ip
            cmd += ["-p", f"{ip}:{p.host_port}:{p.container_port}"]
        if self.shm_size:
            cmd += ["--shm-size", self.shm_size]
        for u in self.ulimits:
            cmd += ["--ulimit", f"{u.name}={u.soft}:{u.hard}"]
        for m in self.mounts:
            cmd += ["-v", m.docker_cli()]
        for k, v in self.labels.items():
            cmd += ["--label", f"{k}={v}"]
        if self.gpus is not None:
            cmd += ["--gpus", self._gpus_cli()]
        for d in self.devices:
            cmd += ["--device", d]
        for g in self.groups:
            cmd += ["--group-add", g]
        for o in self.security_opt:
            cmd += ["--security-opt", o]
        if self.user:
            cmd += ["--user", self.user]
        for k, v in self.env.items():
            cmd += ["-e", f"{k}={v}"]
        for k in self.secret_env_names:
            if k not in self.env:
                cmd += ["-e", k]
        return [*cmd, "--entrypoint", self.entrypoint[0], self.image, *self.entrypoint[1:], *self.command]

    def sdk_kwargs(self, secret_env: dict[str, str] | None = None, *, detach: bool = True) -> dict[str, Any]:
        """Keyword arguments of the docker SDK's ``containers.run`` (``containers.create`` without ``detach``).
        The environment gets the values of ``secret_env`` named in ``secret_env_names`` (a name without a value
        is left out, as ``docker run -e NAME`` leaves out a variable the caller has not set)."""
        import docker  # noqa: PLC0415

        env = dict(self.env)
        env.update({k: secret_env[k] for k in self.secret_env_names if secret_env and k in secret_env})
        spec: dict[str, Any] = {
            "image": self.image,
            "name": self.name,
            "entrypoint": list(self.entrypoint),
            "command": list(self.command),
            "restart_policy": {"Name": self.restart},
            "stdin_open": False,
            "tty": False,
            "labels": dict(self.labels),
        }
        if detach:
            spec["detach"] = True
        if self.user:
            spec["user"] = self.user
        if self.network == "host":
            spec["network_mode"] = "host"
        if self.ports:
            spec["ports"] = {f"{p.container_port}/tcp": (p.host_ip, p.host_port) for p in self.ports}
        if self.ipc:
            spec["ipc_mode"] = self.ipc
        if self.shm_size:
            spec["shm_size"] = self.shm_size
        if self.ulimits:
            spec["ulimits"] = [docker.types.Ulimit(name=u.name, soft=u.soft, hard=u.hard) for u in self.ulimits]
        spec["volumes"] = {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in self.mounts}
        if self.gpus is not None:
            ids = list(self.gpus.ids) or None
            spec["device_requests"] = [
                docker.types.DeviceRequest(
                    driver=self.gpus.driver,
                    device_ids=ids,
                    count=None if ids else -1,
                    capabilities=[list(c) for c in self.gpus.capabilities],
                )
            ]
        if self.devices:
            spec["devices"] = [f"{d}:{d}:rwm" for d in self.devices]
        if self.groups:
            spec["group_add"] = list(self.groups)
        if self.security_opt:
            spec["security_opt"] = list(self.security_opt)
        spec["environment"] = env
        return spec


#: GiB of /dev/shm per tensor-parallel rank when --ipc=host is not allowed (F14: 16 GiB for TP8).
SHM_GIB_PER_RANK = 2

LABEL_PREFIX = "m3ctl."
#: Label holding ``<state dir>::<name>`` (as the process runtime's marker): ``stop --all`` of a state dir finds its
#: containers by it when their records are gone.
DEPLOYMENT_LABEL = LABEL_PREFIX + "deployment"


class DockerOptions(_Model):
    """Container-side settings that are not part of the launch plan (recorded with the deployment).

    Attributes:
        network: ``host`` (share the host network) or ``bridge`` (publish the plan's port).
        ipc_host: ``--ipc=host``; False sizes ``/dev/shm`` instead (``shm_size`` or 2 GiB x TP).
        shm_size: explicit ``/dev/shm`` size (docker syntax, e.g. ``16g``) when ``ipc_host`` is False.
        mounts: extra bind mounts ``HOST:CONTAINER[:ro|rw]`` (read-only unless ``rw``).
        gpu_vendor: ``nvidia`` / ``amd`` / None (CPU).
        gpu_devices: GPUs to expose, UUIDs or indices; empty with a vendor means all.
    """

    network: Literal["host", "bridge"] = "host"
    ipc_host: bool = True
    shm_size: str | None = None
    mounts: list[str] = Field(default_factory=list)
    gpu_vendor: str | None = None
    gpu_devices: list[str] = Field(default_factory=list)

    @classmethod
    def for_host(cls, inventory: Any = None, **kw: Any) -> Self:
        """Options exposing every GPU of ``inventory`` (a :class:`~m3ctl.hw.inventory.HostInventory`)
        by UUID where known (F02: UUIDs go to the device request, not to CUDA_VISIBLE_DEVICES)."""
        gpus = list(getattr(inventory, "gpus", ()) or ())
        if gpus:
            kw.setdefault("gpu_vendor", gpus[0].vendor)
            kw.setdefault("gpu_devices", [g.uuid or str(g.index) for g in gpus])
        return cls(**kw)


def docker_run(
    spec: LaunchSpec,
    opts: DockerOptions | None = None,
    *,
    secret_names: list[str] | tuple[str, ...] = (),
    marker: str | None = None,
) -> DockerRun:
    """The :class:`DockerRun` of a launch spec with an image, under the docker runtime's options ``opts`` (a
    :class:`DockerOptions`; default: host network, ``--ipc=host``, the plan's GPUs).

    - ``opts.gpu_vendor``/``gpu_devices`` (a host's GPUs), when set, replace the plan's (:func:`container_gpus`);
      the vendor's device request, device nodes, groups and security options: :mod:`m3ctl.catalog.vendors`.
    - Host network: the server listens where the plan says; bridge: on 0.0.0.0 inside, the port published on the
      plan's address only.
    - ``ipc_host`` False: ``/dev/shm`` of ``opts.shm_size`` or 2 GiB x TP, and ``memlock`` unlimited (F14).
    - Mounts: the spec's, then ``opts.mounts``; an HF cache that does not exist on this host is not mounted (the
      engine would create an empty root-owned directory).
    - ``secret_names``: more secret variable names (a launch's secret environment), by name only.
    - ``marker``: the ``m3ctl.deployment`` label (``<state dir>::<name>``: ``stop --all`` finds the container by it).

    Raises:
        BadInput: the spec has no container (no image).
        ConfigRejected: a malformed extra mount.
    """

    if opts is None:
        opts = DockerOptions()
    c = spec.container
    if c is None:
        raise BadInput("the plan has no image (runtime process)", "plan with --runtime docker to emit container forms")
    devices, env = c.devices, dict(c.env)
    if opts.gpu_vendor:  # the runtime's view of this host's GPUs
        devices, env = container_gpus(opts.gpu_vendor, list(opts.gpu_devices), env)
    f = vendors.facts(devices.vendor)
    gpus = None
    if f is not None and (req := f.container.device_request.value) is not None:
        gpus = GpuRequest(driver=req.driver, ids=list(devices.ids), capabilities=req.capabilities)
    mounts: list[Mount] = []
    for m in [*c.mounts, *(parse_mount(x) for x in opts.mounts)]:
        if m.kind == "hf-cache" and m.read_only and not Path(m.source).is_dir():
            continue  # offline and nothing cached here: nothing to read (the engine would create an empty dir)
        mounts = [x for x in mounts if x.source != m.source]  # one bind per host path (the SDK's volumes dict)
        mounts.append(m)
    labels = dict(c.labels)
    if marker:
        labels[DEPLOYMENT_LABEL] = marker
    host_net = opts.network == "host"
    return DockerRun(
        name=c.name,
        image=c.image,
        entrypoint=list(c.entrypoint),
        command=spec.serve_args() if host_net else list(c.command),
        network="host" if host_net else "bridge",
        ports=[] if host_net else [PortMap(host_ip=spec.host, host_port=spec.port, container_port=spec.port)],
        ipc="host" if opts.ipc_host else None,
        shm_size=None if opts.ipc_host else (opts.shm_size or f"{SHM_GIB_PER_RANK * spec.layout.tp}g"),
        ulimits=[] if opts.ipc_host else [Ulimit(name="memlock", soft=-1, hard=-1)],
        mounts=mounts,
        env=env,
        secret_env_names=[*c.secret_env_names, *(k for k in secret_names if k not in c.secret_env_names)],
        gpus=gpus,
        devices=list(f.container.devices.value) if f else [],
        groups=list(f.container.groups.value) if f else [],
        security_opt=list(f.container.security_opt.value) if f else [],
        labels=labels,
        restart=c.restart,
        user=c.user,
    )


def plan_docker_run(
    plan,
    opts: DockerOptions | None = None,
    *,
    secret_names: list[str] | tuple[str, ...] = (),
    marker: str | None = None,
) -> DockerRun:
    """The :class:`DockerRun` of ``plan`` (a :class:`~m3ctl.planning.plan.LaunchPlan`) under ``opts``: the one object
    both the printed ``docker run`` (:func:`m3ctl.planning.emit.docker_command`) and the docker runtime's SDK kwargs
    (:func:`m3ctl.runtime.docker.container_spec`) are rendered from. Arguments as :func:`docker_run`.

    Raises:
        ConfigRejected: no image in the plan, or a malformed mount.
    """

    if not plan.image:
        raise ConfigRejected(
            f"profile {plan.profile!r} names no image for the docker runtime",
            "pass --image REF (a local image works; docs/serve.md, serve --runtime docker)",
        )
    return docker_run(launch_spec(plan), opts or DockerOptions(), secret_names=secret_names, marker=marker)
