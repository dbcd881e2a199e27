"""Render a :class:`~m3ctl.planning.plan.LaunchPlan` as a ``docker run`` command, a compose file, Kubernetes objects, a
LeaderWorkerSet, a shell script or a Ray multi-node script. Pure text rendering of the plan's launch spec
(:func:`m3ctl.planning.launch.launch_spec`, the same spec the docker runtime starts): nothing is started and no argv is
parsed back.

Run flags (vendor facts and their sources: m3ctl/data/vendors.yaml, :mod:`m3ctl.catalog.vendors`): NVIDIA
``--gpus 'driver=nvidia,"device=0,1"'``, the device request the docker runtime sends (the docker CLI reads the
``--gpus`` value as CSV, so a list of devices needs the inner double quotes:
docs.docker.com/engine/containers/resource_constraints/#gpu); AMD ``--device /dev/kfd --device /dev/dri
--group-add video --security-opt seccomp=unconfined`` (rocm.docs.amd.com/projects/install-on-linux/en/latest/how-to/
docker.html; the group: https://docs.vllm.ai/en/stable/deployment/docker/). The ``docker run`` line and the docker
runtime's SDK kwargs are two renders of one :class:`~m3ctl.planning.launch.DockerRun`. The model directory and the HF
cache (when it exists on this host) are mounted read-only. Secret variables are referenced by name, never by value: ``docker run -e VAR`` takes
the value from the caller's environment, compose interpolates ``${VAR:?}``, Kubernetes reads a Secret
(``secretKeyRef``; create it with ``kubectl create secret generic m3ctl-secrets --from-literal=VAR=...``), a
script checks ``: "${VAR:?}"``.

Exposure: every form binds where ``serve`` binds. ``docker run`` and compose share the host network as ``serve
--runtime docker`` does and listen on the plan's ``--host`` (127.0.0.1 unless given; ``--host 0.0.0.0`` is the
explicit opt-in to every interface, and the plan warns when no API key is set); scripts listen on the plan's host
too. Kubernetes and LeaderWorkerSet pods listen inside their pod network and no Service or Ingress is emitted: the
API is reachable only inside the cluster (pod IP) until you expose it deliberately. Every emitted form is checked by a real tool in tests/planning/test_emit.py (docker compose config,
kubernetes-validate, bash -n, the docker CLI's CSV reading of ``--gpus``).
"""

from __future__ import annotations

import copy
import json
import math
import re
import shlex
from typing import TYPE_CHECKING, Any

from m3ctl.catalog import vendors
from m3ctl.catalog.lazy import lazy_module
from m3ctl.core.secrets import source_var
from m3ctl.core.state import Registry
from m3ctl.errors import BadInput
from m3ctl.planning.launch import (
    DP_RPC_PORT,
    ContainerSpec,
    DockerRun,
    LaunchSpec,
    launch_spec,
    multinode_dp_args,
    plan_docker_run,
    serve_command,
)
from m3ctl.planning.plan import LaunchPlan

if TYPE_CHECKING:
    import yaml
else:
    yaml = lazy_module("yaml")

FORMATS = ("docker", "compose", "k8s", "lws", "script", "ray", "vllm-config", "vllm-env")
RAY_PORT = 6379
HF_CACHE = "/root/.cache/huggingface"
PROBE_PERIOD_S = 10
SECRET_NAME = "m3ctl-secrets"


def _container(spec: LaunchSpec) -> ContainerSpec:
    if spec.container is None:
        raise BadInput("the plan has no image (runtime process)", "plan with --runtime docker to emit container forms")
    return spec.container


def _q(tokens: list[str]) -> str:
    return " ".join(shlex.quote(t) for t in tokens)


def docker_run_args(run: DockerRun, *, detach: bool = True) -> list[str]:
    """``docker run`` argv (as the docker CLI receives it) of a :class:`~m3ctl.planning.launch.DockerRun`, the object the
    docker runtime's SDK kwargs are rendered from too (:meth:`~m3ctl.planning.launch.DockerRun.cli_args`)."""
    return run.cli_args(detach=detach)


def docker_command(plan: LaunchPlan, options=None, *, marker: str | None = "") -> str:
    """The ``docker run`` line of what ``serve --runtime docker`` creates for ``plan``: the CLI render of the same
    :class:`~m3ctl.planning.launch.DockerRun` the runtime sends to the engine (:func:`m3ctl.planning.launch.plan_docker_run`),
    under ``options`` (a :class:`~m3ctl.planning.launch.DockerOptions`; default: the runtime's defaults).
    ``marker``: the ``m3ctl.deployment`` label; ``""`` (default) = the default state dir's marker of the plan, as
    the runtime labels it (none for a catalog system's plan: this machine's state dir means nothing there); None =
    no such label.

    Raises:
        BadInput: the plan has no image (runtime process).
        ConfigRejected: a malformed mount in ``options``.
    """
    _container(launch_spec(plan))  # BadInput for a plan without an image
    if marker == "":
        marker = None if plan.target_system else Registry().marker(plan.name)
    return _q(docker_run_args(plan_docker_run(plan, options, marker=marker))) + "\n"


def compose(plan: LaunchPlan) -> str:
    """A compose file with one service (Compose Specification, compose-spec.io)."""
    c = _container(launch_spec(plan))
    svc: dict = {
        "image": c.image,
        "container_name": c.name,
        "entrypoint": list(c.entrypoint),
        "command": list(c.host_command or c.command),
        "ipc": c.ipc,
        "network_mode": "host",
        "volumes": [
            {"type": "bind", "source": m.source, "target": m.target, "read_only": m.read_only} for m in c.mounts
        ],
        "environment": {**c.env, **{k: f"${{{k}:?set {k}}}" for k in c.secret_env_names}},
        "labels": dict(c.labels),
        "restart": c.restart,
    }
    if c.user:
        svc["user"] = c.user
    f = vendors.facts(c.devices.vendor)
    if f is not None and (req := f.container.device_request.value) is not None:  # a GPU reservation (NVIDIA)
        dev: dict = {"driver": req.driver, "capabilities": [cap for caps in req.capabilities for cap in caps]}
        if c.devices.ids:
            dev["device_ids"] = list(c.devices.ids)
        else:
            dev["count"] = "all"
        svc["deploy"] = {"resources": {"reservations": {"devices": [dev]}}}
    if f is not None:  # device nodes, groups, security options (AMD)
        for key, fact in (
            ("devices", f.container.devices),
            ("group_add", f.container.groups),
            ("security_opt", f.container.security_opt),
        ):
            if fact.value:
                svc[key] = list(fact.value)
    return yaml.safe_dump({"services": {_k8s_name(plan.name): svc}}, sort_keys=False)


def _k8s_name(name: str) -> str:
    """A DNS-1123 label from a deployment name (lower case; ``_`` and ``.`` become ``-``)."""
    return re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:63] or "m3ctl"


def _probes(spec: LaunchSpec) -> dict:
    """Startup (``/health`` within the plan's model-size budget), liveness (``/health``) and readiness (the
    served model is listed by ``/v1/models``; the key, when set, is sent from the container's environment)."""
    name = spec.served_model_names[0]
    check = (
        "import json,os,sys,urllib.request as u;"
        f"r=u.Request('http://127.0.0.1:{spec.port}/v1/models');"
        "k=os.environ.get('VLLM_API_KEY');"
        "k and r.add_header('Authorization','Bearer '+k);"
        f"sys.exit(0 if {name!r} in [m['id'] for m in json.load(u.urlopen(r,timeout=5))['data']] else 1)"
    )
    return {
        "startupProbe": {
            "httpGet": {"path": "/health", "port": spec.port},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": max(1, math.ceil(spec.startup_budget_s / PROBE_PERIOD_S)),
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": spec.port},
            "periodSeconds": PROBE_PERIOD_S,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "exec": {"command": ["python3", "-c", check]},
            "periodSeconds": PROBE_PERIOD_S,
            "timeoutSeconds": 8,
        },
    }


def _k8s_pod_parts(spec: LaunchSpec, hf_host_path: str | None, multi_node: bool) -> tuple[list, list, list, list]:
    """(env, volumeMounts, volumes, extra objects) shared by the Deployment and the LeaderWorkerSet."""
    c = _container(spec)
    f = vendors.facts(c.devices.vendor)
    inside = f.container.visibility_env.value if f else None
    # The device plugin picks the GPUs: the visibility variable is not set inside.
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in c.env.items() if k != inside]
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": SECRET_NAME, "key": k}}} for k in c.secret_env_names]
    mounts: list[dict[str, Any]] = [{"name": "shm", "mountPath": "/dev/shm"}]
    vols: list[dict] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    extra: list[dict] = []
    for i, m in enumerate(c.mounts):
        vname = "hf-cache" if m.kind == "hf-cache" else f"{m.kind}-{i}"
        if m.kind == "hf-cache":
            # The first pod fills the cache for a hub model (read-only for a local model or offline: launch.py).
            mounts.append({"name": vname, "mountPath": m.target, "readOnly": m.read_only})
            if hf_host_path:
                vols.append({"name": vname, "hostPath": {"path": hf_host_path, "type": "DirectoryOrCreate"}})
            else:
                claim = f"{_k8s_name(spec.name)}-hf-cache"
                vols.append({"name": vname, "persistentVolumeClaim": {"claimName": claim}})
                extra.append(
                    {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "metadata": {"name": claim, "labels": {"m3ctl.name": _k8s_name(spec.name)}},
                        "spec": {
                            "accessModes": ["ReadWriteMany" if multi_node else "ReadWriteOnce"],
                            "resources": {"requests": {"storage": _cache_size(spec)}},
                        },
                    }
                )
        else:  # the model (or tokenizer/draft) directory on the node, read-only
            mounts.append({"name": vname, "mountPath": m.target, "readOnly": True})
            vols.append({"name": vname, "hostPath": {"path": m.source, "type": "Directory"}})
    return env, mounts, vols, extra


def _cache_size(spec: LaunchSpec) -> str:
    """HF-cache claim size: the checkpoint plus a quarter (tokenizer, a second revision) and 10 GiB;
    100 GiB when the plan does not know the weights."""
    w = spec.weights_gib
    return f"{math.ceil(w * 1.25) + 10}Gi" if w else "100Gi"


def _gpu_limits(spec: LaunchSpec, n: int) -> dict:
    """``resources.limits`` of ``n`` GPUs: the vendor's device plugin resource (m3ctl/data/vendors.yaml)."""
    f = vendors.facts(_container(spec).devices.vendor)
    key = f.k8s.resource.value if f else None
    return {"resources": {"limits": {key: n}}} if key else {}


def k8s(plan: LaunchPlan, hf_host_path: str | None = None) -> str:
    """A Kubernetes Deployment (one node) and, unless ``hf_host_path`` is given, a PersistentVolumeClaim for the
    HF cache (multi-document YAML: the claim first)."""
    spec = launch_spec(plan)
    c = _container(spec)
    env, mounts, vols, extra = _k8s_pod_parts(spec, hf_host_path, multi_node=False)
    container = {
        "name": "vllm",
        "image": c.image,
        "command": list(c.entrypoint),
        "args": list(c.command),
        "ports": [{"containerPort": c.port}],
        "env": env,
        **_probes(spec),
        "volumeMounts": mounts,
        **_gpu_limits(spec, spec.layout.num_gpus),
    }
    name = _k8s_name(plan.name)
    dep = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"m3ctl.name": name, "m3ctl.plan-hash": plan.plan_hash()}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container], "volumes": vols}},
        },
    }
    return CLUSTER_NOTE.format(port=c.port) + yaml.safe_dump_all([*extra, dep], sort_keys=False)


#: First line of the Kubernetes forms: what is (not) exposed.
CLUSTER_NOTE = (
    "# m3ctl: no Service or Ingress is emitted: the API (port {port}) is reachable only inside the cluster"
    " (pod IP); expose it deliberately.\n"
)


def lws(plan: LaunchPlan, nodes: int = 2, hf_host_path: str | None = None) -> str:
    """A LeaderWorkerSet (https://lws.sigs.k8s.io) for multi-node data parallel: ``nodes`` pods of the plan's
    GPUs each. The plan's DP (default: 1 per node, TP = GPUs per node) is the per-node
    ``--data-parallel-size-local``; the total ``--data-parallel-size`` is ``DP x nodes``; the leader (rank 0)
    serves the API, each worker runs ``--headless`` with ``--data-parallel-start-rank = index x DP``
    (vLLM multi-node data parallel: docs.vllm.ai/en/latest/serving/data_parallel_deployment.html; the leader
    passes no start rank: :func:`m3ctl.planning.launch.multinode_dp_args`, run end to end on 127.0.0.1).
    ``LWS_LEADER_ADDRESS`` / ``LWS_WORKER_INDEX`` are set by the LWS controller. The HF cache is a
    ReadWriteMany claim (or ``hf_host_path`` on every node).

    Raises:
        BadInput: fewer than 2 nodes, or a plan without an image.
    """
    if nodes < 2:
        raise BadInput(f"--nodes {nodes}: a LeaderWorkerSet needs at least 2 nodes", "use --emit k8s for one node")
    spec = launch_spec(plan, nodes=nodes)
    c = _container(spec)
    dp_local = max(1, spec.layout.dp)
    rank = f"$(( LWS_WORKER_INDEX * {dp_local} ))"
    lead_args = multinode_dp_args(spec, nodes, "$(LWS_LEADER_ADDRESS)", None, DP_RPC_PORT)
    work_args = multinode_dp_args(spec, nodes, "$(LWS_LEADER_ADDRESS)", rank, DP_RPC_PORT)
    env, mounts, vols, extra = _k8s_pod_parts(spec, hf_host_path, multi_node=True)
    per_pod = spec.layout.num_gpus

    def container(args: list[str], leader: bool) -> dict:
        text = " ".join(a if a.startswith("$(") else shlex.quote(a) for a in ["vllm", *args])
        ct: dict = {
            "name": "vllm",
            "image": c.image,
            "command": ["sh", "-c"],
            "args": [text],
            "env": copy.deepcopy(env),
            "volumeMounts": copy.deepcopy(mounts),
            **_gpu_limits(spec, per_pod),
        }
        if leader:
            ct["ports"] = [{"containerPort": c.port}]
            ct.update(_probes(spec))
        return ct

    leader = container(lead_args, leader=True)
    worker = container(work_args, leader=False)
    name = _k8s_name(plan.name)
    doc = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": {"m3ctl.name": name, "m3ctl.plan-hash": plan.plan_hash()}},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": nodes,
                "leaderTemplate": {"spec": {"containers": [leader], "volumes": copy.deepcopy(vols)}},
                "workerTemplate": {"spec": {"containers": [worker], "volumes": copy.deepcopy(vols)}},
            },
        },
    }
    return CLUSTER_NOTE.format(port=c.port) + yaml.safe_dump_all([*extra, doc], sort_keys=False)


def _script_head(plan: LaunchPlan, spec: LaunchSpec, env: dict[str, str]) -> list[str]:
    lines = [
        "#!/usr/bin/env bash",
        f"# m3ctl plan {plan.name} ({plan.plan_hash()}): profile {plan.profile}",
        "set -euo pipefail",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines += [f"unset {k}" for k in spec.unset_env]
    lines += [f': "${{{k}:?set {k} in the environment}}"' for k in spec.secret_env_names]
    return lines


def script(plan: LaunchPlan) -> str:
    """A bash script for the target host: the ``docker run`` of a docker plan (its image), else ``vllm serve``
    with ``vllm`` from PATH (``$VLLM`` overrides it); listens on the plan's host (``--host``)."""
    spec = launch_spec(plan)
    if spec.container is not None:
        lines = _script_head(plan, spec, {})
        lines.append("exec " + _q(docker_run_args(plan_docker_run(plan), detach=False)))
        return "\n".join(lines) + "\n"
    lines = _script_head(plan, spec, spec.env)
    lines.append('exec "${VLLM:-vllm}" ' + _q(spec.serve_args()))
    return "\n".join(lines) + "\n"


def ray(plan: LaunchPlan, nodes: int = 2) -> str:
    """A bash script for a Ray cluster of ``nodes`` hosts: ``ray.sh head`` starts the head and then
    ``vllm serve --distributed-executor-backend ray`` with TP = the plan's GPUs per node and PP = ``nodes``;
    ``ray.sh worker HEAD_IP`` joins a worker (vLLM "Multi-node deployment",
    docs.vllm.ai/en/latest/serving/parallelism_scaling.html: TP within a node, PP across nodes).

    Raises:
        BadInput: fewer than 2 nodes, DP > 1 (multi-node DP is ``--emit lws``), or a plan without GPUs (vLLM's CPU
            backend: Ray's ``--num-gpus`` and TP x PP over GPU nodes do not apply).
    """
    if plan.gpu_vendor is None:
        raise BadInput(
            f"the Ray form spreads TP x PP over GPU nodes; this plan (profile {plan.profile}) has no GPUs",
            "plan for a GPU system: m3ctl plan --system NAME --emit ray (`m3ctl plan --systems all` lists them)",
        )
    if nodes < 2:
        raise BadInput(f"--nodes {nodes}: a Ray cluster form needs at least 2 nodes", "use --emit script for one node")
    spec = launch_spec(plan, nodes=nodes)
    if spec.vllm_args is None:
        raise BadInput("this saved plan has no typed vLLM flags", "plan it again to emit multi-node forms")
    if spec.layout.dp > 1:
        raise BadInput(
            f"the Ray form spreads TP x PP over nodes; this plan has DP {spec.layout.dp}",
            "use --emit lws for multi-node data parallel, or plan with --dp 1",
        )
    args = {**spec.vllm_args, "pipeline-parallel-size": nodes, "distributed-executor-backend": "ray"}

    serve = serve_command(spec.model, spec.host, spec.port, spec.served_model_names, args)
    gpus = spec.layout.tp
    lines = _script_head(plan, spec, spec.env)
    lines += [
        f"# {nodes} nodes x {gpus} GPU(s): run `$0 head` on the head node, `$0 worker HEAD_IP` on the others",
        f"RAY_PORT={RAY_PORT}",
        'case "${1:-}" in',
        "  head)",
        f'    ray start --head --port "$RAY_PORT" --num-gpus {gpus}',
        f'    until [ "$(ray status 2>/dev/null | grep -c node_)" -ge {nodes} ]; do sleep 5; done',
        '    exec "${VLLM:-vllm}" ' + _q(serve) + " ;;",
        "  worker)",
        '    exec ray start --address "${2:?HEAD_IP}:$RAY_PORT" ' + f"--num-gpus {gpus} --block ;;",
        '  *) echo "usage: $0 head | $0 worker HEAD_IP" >&2; exit 2 ;;',
        "esac",
    ]
    return "\n".join(lines) + "\n"


def _config_key(key: str) -> str:
    k = key.lstrip("-")
    return k if "." in k else k.replace("_", "-")  # dotted keys keep their underscores, as vLLM spells them


def vllm_config(plan: LaunchPlan) -> str:
    """The plan as vLLM's own ``--config`` file: ``vllm serve --config FILE`` starts what the plan starts (its
    environment: :func:`vllm_env`). vLLM reads each key as ``--KEY VALUE``, ``true`` as the switch, ``false`` as its
    ``--no-`` form, a list as several values and a mapping as JSON (vllm/utils/argparse_utils.py,
    ``FlexibleArgumentParser.load_config_file``; https://docs.vllm.ai/en/latest/configuration/serve_args/), so a
    JSON-list value is written as its JSON text and a tuple (``nargs="+"``) as a list.

    Raises:
        BadInput: a saved plan without typed flags.
    """
    spec = launch_spec(plan)
    if spec.vllm_args is None:
        raise BadInput("this saved plan has no typed vLLM flags", "plan it again to emit a vLLM config file")
    doc: dict[str, Any] = {
        "model": spec.model,
        "host": spec.host,
        "port": spec.port,
        "served-model-name": list(spec.served_model_names),
    }
    for key, val in spec.vllm_args.items():
        if val is None:
            continue
        if isinstance(val, tuple):
            val = [str(v) for v in val]
        elif isinstance(val, list):
            val = json.dumps(val, separators=(",", ":"))
        doc[_config_key(key)] = val
    head = (
        f"# m3ctl plan {plan.name} ({plan.plan_hash()}): vllm serve --config THIS_FILE, environment: --emit vllm-env\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def vllm_env(plan: LaunchPlan) -> str:
    """The environment of :func:`vllm_config`'s server as an env file (``KEY=VALUE`` lines: ``docker run
    --env-file``, systemd ``EnvironmentFile=``, ``set -a; . FILE``). Secrets are named, never written: each is a
    comment saying to set it; variables the launch unsets are comments too.

    Raises:
        BadInput: a value with a newline (no env-file form holds it).
    """
    spec = launch_spec(plan)
    lines = [f"# m3ctl plan {plan.name} ({plan.plan_hash()}): the environment of vllm serve --config"]
    for k, v in spec.env.items():
        if "\n" in v:
            raise BadInput(f"environment variable {k} holds a newline, which an env file cannot", "use --emit script")
        lines.append(f"{k}={v}")
    lines += [f"# unset {k} (the launch removes it from the environment)" for k in spec.unset_env]
    lines += [
        f"# {k}: a secret: set it in the server's environment (never written here)" for k in spec.secret_env_names
    ]
    return "\n".join(lines) + "\n"


def render(plan: LaunchPlan, fmt: str, nodes: int = 2, hf_host_path: str | None = None) -> str:
    """Render ``plan`` as ``docker``, ``compose``, ``k8s``, ``lws`` (multi-node DP, ``nodes`` pods), ``script``,
    ``ray`` (multi-node TP x PP, ``nodes`` hosts), ``vllm-config`` (vLLM's ``--config`` YAML) or ``vllm-env`` (its
    env file). ``hf_host_path``: k8s/LWS mount this node path as the HF cache
    instead of a PersistentVolumeClaim.

    Raises:
        BadInput: unknown format, or a container format for a plan without an image.
    """
    if fmt == "lws":
        return lws(plan, nodes, hf_host_path)
    if fmt == "ray":
        return ray(plan, nodes)
    if fmt == "k8s":
        return k8s(plan, hf_host_path)
    fn = {
        "docker": bound_docker_command,
        "compose": compose,
        "script": script,
        "vllm-config": vllm_config,
        "vllm-env": vllm_env,
    }.get(fmt)
    if fn is None:
        raise BadInput(f"unknown --emit format {fmt!r}", f"use one of: {', '.join(FORMATS)}")
    return fn(plan)


def launch_command(p: LaunchPlan, runtime: Any = None) -> str:
    """The command line that starts ``p``, for display: the ``docker run`` of a docker plan (rendered from the
    :class:`~m3ctl.planning.launch.DockerRun` the docker runtime creates, under ``runtime``'s options: its mounts too),
    else the process command. A secret the server gets from another variable of this shell (``serve
    --api-key-env MY_KEY``: ``VLLM_API_KEY`` from ``$MY_KEY``) is bound by name in front
    (``VLLM_API_KEY="$MY_KEY" docker run ... -e VLLM_API_KEY``), as the launch binds it; never a value."""
    if p.runtime == "docker" and p.image:
        cmd = docker_command(p, getattr(runtime, "options", None)).strip()
    else:
        cmd = p.command_line()
    return " ".join([*secret_bindings(p), cmd])


def secret_bindings(p: LaunchPlan) -> list[str]:
    """``VLLM_API_KEY="$MY_KEY"``: each secret the server takes from another variable of the caller's shell
    (``--api-key-env MY_KEY``), bound by name in front of the command; never a value."""
    return [f'{k}="${src}"' for k in p.secret_env_names if (src := source_var(p, k)) != k]


def bound_docker_command(p: LaunchPlan) -> str:
    """``plan --emit docker``: :func:`docker_command` with its :func:`secret_bindings` in front, as
    :func:`launch_command` prints it and the launch binds it (``-e VLLM_API_KEY`` alone would pass no key where it
    is in ``$MY_KEY``, and vLLM would serve without authentication)."""
    return " ".join([*secret_bindings(p), docker_command(p)])
