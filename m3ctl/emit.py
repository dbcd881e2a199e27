"""Render a :class:`~m3ctl.plan.LaunchPlan` as a docker command, a compose service, a Kubernetes
Deployment, or a shell script. Pure text rendering: nothing is started.

Run flags: NVIDIA ``--runtime nvidia --gpus ... --ipc=host`` (https://docs.vllm.ai/en/stable/deployment/docker/);
AMD ``--device /dev/kfd --device /dev/dri --group-add video --security-opt seccomp=unconfined --ipc=host``
(vllm-recipes MiniMax-M3 guide). Secret variables are referenced by name (``-e HF_TOKEN``), never by value.
"""

from __future__ import annotations

import copy
import shlex

import yaml

from m3ctl.errors import BadInput
from m3ctl.plan import LaunchPlan
from m3ctl.secrets import redact_env

FORMATS = ("docker", "compose", "k8s", "lws", "script")
DP_RPC_PORT = 13345
HF_CACHE = "/root/.cache/huggingface"


def _vendor(plan: LaunchPlan) -> str:
    return "amd" if plan.profile.startswith("cdna") else ("cpu" if plan.profile == "cpu" else "nvidia")


def _serve_args(plan: LaunchPlan) -> list[str]:
    args = list(plan.argv[1:])  # drop the local executable: images run `vllm serve ...`
    if "--host" in args:
        args[args.index("--host") + 1] = "0.0.0.0"
    return args


def docker_command(plan: LaunchPlan) -> str:
    """A ``docker run`` line equivalent to the plan."""
    if not plan.image:
        raise BadInput("the plan has no image (runtime process)", "plan with --runtime docker to emit container forms")
    cmd = ["docker", "run", "-d", "--name", plan.name, "--ipc=host", "-p", f"{plan.port}:{plan.port}",
           "-v", f"$HOME/.cache/huggingface:{HF_CACHE}", "--label", f"m3ctl.name={plan.name}",
           "--label", f"m3ctl.plan={plan.plan_hash()}"]
    if _vendor(plan) == "nvidia":
        devices = ",".join(map(str, plan.gpus)) if plan.gpus else "all"
        cmd += ["--runtime", "nvidia", "--gpus", f'"device={devices}"']
    elif _vendor(plan) == "amd":
        cmd += ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video",
                "--security-opt", "seccomp=unconfined"]
    for k, v in plan.env.items():
        cmd += ["-e", f"{k}={v}"]
    for k in plan.secret_env_names:
        cmd += ["-e", k]
    cmd.append(plan.image)
    return " ".join(c if c.startswith(("$", '"')) else shlex.quote(c) for c in cmd) + " " + shlex.join(_serve_args(plan)[1:]) + "\n"


def compose(plan: LaunchPlan) -> str:
    """A docker-compose file with one service."""
    if not plan.image:
        raise BadInput("the plan has no image (runtime process)", "plan with --runtime docker to emit container forms")
    svc: dict = {"image": plan.image, "command": _serve_args(plan)[1:], "ipc": "host",
                 "ports": [f"{plan.port}:{plan.port}"], "volumes": [f"${{HOME}}/.cache/huggingface:{HF_CACHE}"],
                 "environment": {**plan.env, **{k: f"${{{k}}}" for k in plan.secret_env_names}},
                 "labels": {"m3ctl.name": plan.name, "m3ctl.plan": plan.plan_hash()}, "restart": "no"}
    if _vendor(plan) == "nvidia":
        svc["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "device_ids": [str(g) for g in plan.gpus] or None, "capabilities": ["gpu"]}]}}}
        if not plan.gpus:
            svc["deploy"]["resources"]["reservations"]["devices"][0].pop("device_ids")
    elif _vendor(plan) == "amd":
        svc.update(devices=["/dev/kfd", "/dev/dri"], group_add=["video"], security_opt=["seccomp=unconfined"])
    return yaml.safe_dump({"services": {plan.name: svc}}, sort_keys=False)


def k8s(plan: LaunchPlan) -> str:
    """A Kubernetes Deployment (single node; multi-node needs a LeaderWorkerSet, not rendered here)."""
    if not plan.image:
        raise BadInput("the plan has no image (runtime process)", "plan with --runtime docker to emit container forms")
    n = max(1, len(plan.gpus))
    res_key = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}.get(_vendor(plan))
    env = [{"name": k, "value": v} for k, v in plan.env.items()]
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": "m3ctl-secrets", "key": k}}}
            for k in plan.secret_env_names]
    container = {"name": "vllm", "image": plan.image, "command": ["vllm"], "args": _serve_args(plan),
                 "ports": [{"containerPort": plan.port}], "env": env,
                 "startupProbe": {"httpGet": {"path": "/v1/models", "port": plan.port}, "periodSeconds": 10,
                                  "failureThreshold": int(plan.startup_budget_s // 10) + 1},
                 "readinessProbe": {"httpGet": {"path": "/health", "port": plan.port}, "periodSeconds": 10},
                 "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}, {"name": "hf", "mountPath": HF_CACHE}]}
    if res_key:
        container["resources"] = {"limits": {res_key: n}}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": plan.name, "labels": {"m3ctl.name": plan.name, "m3ctl.plan": plan.plan_hash()}},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": plan.name}},
                    "template": {"metadata": {"labels": {"app": plan.name}},
                                 "spec": {"containers": [container],
                                          "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}},
                                                      {"name": "hf", "emptyDir": {}}]}}}}
    return yaml.safe_dump(dep, sort_keys=False)


def lws(plan: LaunchPlan, nodes: int = 2) -> str:
    """A LeaderWorkerSet (https://lws.sigs.k8s.io) for multi-node data parallel: ``nodes`` pods of ``len(gpus)``
    GPUs each. The plan's DP (default: 1 per node, TP = GPUs per node) is the per-node
    ``--data-parallel-size-local``; the total ``--data-parallel-size`` is ``DP x nodes``; the leader (rank 0)
    serves the API, each worker runs ``--headless`` with ``--data-parallel-start-rank = index x DP``
    (vLLM multi-node data parallel: docs.vllm.ai/en/latest/serving/data_parallel_deployment.html).
    ``LWS_LEADER_ADDRESS`` / ``LWS_WORKER_INDEX`` are set by the LWS controller.

    Raises:
        BadInput: fewer than 2 nodes, or a plan without an image.
    """
    if nodes < 2:
        raise BadInput(f"--nodes {nodes}: a LeaderWorkerSet needs at least 2 nodes", "use --emit k8s for one node")
    if not plan.image:
        raise BadInput("the plan has no image (runtime process)", "plan with --runtime docker to emit container forms")
    dp_local = max(1, plan.dp)
    base = [a for a in _serve_args(plan)]
    for flag in ("--data-parallel-size",):
        if flag in base:
            i = base.index(flag)
            del base[i:i + 2]
    dp_args = ["--data-parallel-size", str(dp_local * nodes), "--data-parallel-size-local", str(dp_local),
               "--data-parallel-address", "$(LWS_LEADER_ADDRESS)", "--data-parallel-rpc-port", str(DP_RPC_PORT)]
    n = max(1, len(plan.gpus))
    res_key = {"nvidia": "nvidia.com/gpu", "amd": "amd.com/gpu"}.get(_vendor(plan))
    env = [{"name": k, "value": v} for k, v in plan.env.items()]
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": "m3ctl-secrets", "key": k}}}
            for k in plan.secret_env_names]

    def container(args: list[str], probes: bool) -> dict:
        c: dict = {"name": "vllm", "image": plan.image, "command": ["sh", "-c"],
                   "args": [" ".join(shlex.quote(a) if not a.startswith("$(") else a for a in ["vllm", *args])],
                   "env": copy.deepcopy(env), "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
        if res_key:
            c["resources"] = {"limits": {res_key: n}}
        if probes:
            c["ports"] = [{"containerPort": plan.port}]
            c["startupProbe"] = {"httpGet": {"path": "/v1/models", "port": plan.port}, "periodSeconds": 10,
                                 "failureThreshold": int(plan.startup_budget_s // 10) + 1}
        return c

    leader = container([*base, *dp_args, "--data-parallel-start-rank", "0"], probes=True)
    worker = container([*base, *dp_args, "--headless", "--data-parallel-start-rank",
                        f"$(( LWS_WORKER_INDEX * {dp_local} ))"], probes=False)
    worker["args"] = [worker["args"][0].replace("'$(( LWS_WORKER_INDEX * " + str(dp_local) + " ))'",
                                                f"$(( LWS_WORKER_INDEX * {dp_local} ))")]
    def vols() -> list[dict]:
        return [{"name": "shm", "emptyDir": {"medium": "Memory"}}]

    doc = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": plan.name, "labels": {"m3ctl.name": plan.name, "m3ctl.plan": plan.plan_hash()}},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {
               "size": nodes,
               "leaderTemplate": {"spec": {"containers": [leader], "volumes": vols()}},
               "workerTemplate": {"spec": {"containers": [worker], "volumes": vols()}}}}}
    return yaml.safe_dump(doc, sort_keys=False)


def script(plan: LaunchPlan) -> str:
    """A bash script that runs the plan's ``vllm serve`` (process form) with its environment."""
    lines = ["#!/usr/bin/env bash", f"# m3ctl plan {plan.name} ({plan.plan_hash()}): profile {plan.profile}", "set -euo pipefail"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in redact_env(plan.env).items()]
    lines += [f': "${{{k}:?set {k} in the environment}}"' for k in plan.secret_env_names]
    lines.append("exec " + shlex.join(plan.argv))
    return "\n".join(lines) + "\n"


def render(plan: LaunchPlan, fmt: str, nodes: int = 2) -> str:
    """Render ``plan`` as ``docker``, ``compose``, ``k8s``, ``lws`` (multi-node, ``nodes`` pods) or ``script``.

    Raises:
        BadInput: unknown format, or a container format for a plan without an image.
    """
    if fmt == "lws":
        return lws(plan, nodes)
    fn = {"docker": docker_command, "compose": compose, "k8s": k8s, "script": script}.get(fmt)
    if fn is None:
        raise BadInput(f"unknown --emit format {fmt!r}", f"use one of: {', '.join(FORMATS)}")
    return fn(plan)
