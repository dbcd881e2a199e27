"""Multi-node data parallel on one machine: the leader and a ``--headless`` second "node" rendered by
:func:`m3ctl.planning.launch.multinode_dp_args` (the LeaderWorkerSet form uses the same function), run as two process
groups on 127.0.0.1 with vLLM's CPU build; the API only answers once both DP engines joined."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from m3ctl.assess.request import PlanRequest
from m3ctl.hw.inventory import HostInventory
from m3ctl.planning.launch import launch_spec, multinode_dp_args
from m3ctl.planning.plan import find_vllm_executable, plan
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def test_two_node_data_parallel_on_localhost(tiny_models, tmp_path):
    p = plan(HostInventory(), PlanRequest(model=str(tiny_models["llama"]), name="mn", port=free_port()))
    spec = launch_spec(p, nodes=2)
    rpc = free_port()
    lead = multinode_dp_args(spec, 2, "127.0.0.1", None, rpc, host="127.0.0.1")
    work = multinode_dp_args(spec, 2, "127.0.0.1", 1, rpc, host="127.0.0.1")
    assert "--headless" in work and "--data-parallel-start-rank" not in lead
    exe = find_vllm_executable()
    env = {**os.environ, "VLLM_PORT": str(free_port())}
    procs = []
    try:
        for name, args in (("lead", lead), ("work", work)):
            with open(tmp_path / f"{name}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [exe, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
                    )
                )
        url = f"http://127.0.0.1:{p.port}"
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert all(x.poll() is None for x in procs), (tmp_path / "lead.log").read_text()[-3000:] + (
                tmp_path / "work.log"
            ).read_text()[-3000:]
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        r = httpx.post(
            f"{url}/v1/completions",
            json={"model": spec.served_model_names[1], "prompt": "hello", "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert "EngineCore_DP1" in (tmp_path / "work.log").read_text()  # the second node's engine
    finally:
        for x in procs:
            try:
                os.killpg(x.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for x in procs:
            try:
                x.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(x.pid, signal.SIGKILL)
                x.wait(5)
