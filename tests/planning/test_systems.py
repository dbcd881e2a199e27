"""Hosts you don't have: the systems catalog (m3ctl/data/systems.yaml), --system on doctor/plan/tune, and the
sizing view (plan --systems). The catalog must give what detection gives on the recorded and synthetic hosts."""

from __future__ import annotations

import json

import pytest

from m3ctl.assess.request import PlanRequest
from m3ctl.checks.doctor import run_doctor
from m3ctl.errors import CatalogError, ConfigRejected
from m3ctl.hw.systems import UnknownSystem, inventory_for_system, load_systems, resolve_system, system_names
from m3ctl.planning.plan import plan
from m3ctl.planning.sizing import size_systems
from tests.checks.test_doctor_hosts import EXPECTED, host
from tests.conftest import run_cli

# Detected fixture host -> catalog system with the same GPUs.
PAIRS = {
    "nvidia-h200x2": "h200x2",
    "synthetic-b200x8": "b200x8",
    "synthetic-gb300x4": "gb300x4",
    "synthetic-rubinx8": "rubinx8",
    "synthetic-rtxpro6000x4": "rtxpro6000x4",
    "synthetic-mi300xx8": "mi300xx8",
    "synthetic-mi355xx8": "mi355xx8",
}

# Fields where the catalog intentionally differs from the old fixture, and why.
DIFFERENCES = {
    # The fixtures took the vendor's GB as GiB; the catalog holds what NVML / amdsmi really report.
    "synthetic-b200x8": {"memory_total_mib": "nvidia-smi reads 183359 MiB, not 180 x 1024", "numa_nodes": "host fact"},
    "synthetic-gb300x4": {"memory_total_mib": "nvidia-smi reads 284208 MiB, not 288 x 1024", "numa_nodes": "host fact"},
    "synthetic-mi300xx8": {
        "memory_total_mib": "amd-smi reads 196592 MB, not 192 x 1024",
        "driver_version": "6.10.5 was FakeAmdSmi's unsourced default",
    },
    "synthetic-mi355xx8": {
        "memory_total_mib": "amd-smi reads 294896 MB, not 288 x 1024",
        "driver_version": "6.10.5 was FakeAmdSmi's unsourced default",
    },
    # Rubin's NUMA layout is not public: the catalog leaves it unknown.
    "synthetic-rubinx8": {"numa_node": "not public"},
    # 4-GPU servers carry the Server Edition card (the fixture named the Workstation Edition).
    # Its topology said NODE between GPUs on different NUMA nodes; across sockets NVML reports SYS.
    "synthetic-rtxpro6000x4": {
        "name": "Server Edition in servers",
        "numa_nodes": "host fact",
        "links": "SYS across sockets",
    },
    # The real capture's NVML snapshot has no NUMA reading (that host is one socket: topo -m says NUMA 0 for
    # both GPUs); an HGX H200 node is two sockets, so two of its GPUs sit on nodes 0 and 1.
    "nvidia-h200x2": {"numa_node": "not in the NVML snapshot", "numa_nodes": "host fact"},
}

GPU_FIELDS = (
    "vendor",
    "name",
    "arch",
    "compute_capability",
    "gfx_target",
    "memory_total_mib",
    "brand",
    "numa_node",
    "nvlinks_active",
    "fabric_state",
    "mig_mode",
)
HOST_FIELDS = ("probe", "driver_version", "cuda_driver_version", "rocm_version", "numa_nodes")


def _facts(inv) -> dict:
    out = {f: tuple(getattr(g, f) for g in inv.gpus) for f in GPU_FIELDS}
    out.update({f: getattr(inv, f) for f in HOST_FIELDS})
    out["links"] = tuple((lk.a, lk.b, lk.kind, lk.detail, lk.count) for lk in inv.links)
    out["gpus"] = len(inv.gpus)
    return out


@pytest.mark.parametrize("fixture", sorted(PAIRS))
def test_catalog_inventory_equals_detection_of_the_fixture(fixture):
    """Every fact detection reads from the fixture, the catalog gives too, except the listed differences
    (which must really differ, so the list stays true)."""
    detected, built = _facts(host(fixture)), _facts(inventory_for_system(PAIRS[fixture]))
    diff = {k for k in detected if detected[k] != built[k]}
    assert diff == set(DIFFERENCES.get(fixture, {})), {k: (detected[k], built[k]) for k in diff}


@pytest.mark.parametrize("fixture", sorted(PAIRS))
def test_doctor_verdict_on_the_catalog_system_equals_the_fixture_verdict(fixture):
    _arch, status, variant, tp = EXPECTED[fixture]
    rep = run_doctor(inventory_for_system(PAIRS[fixture]), host_checks=False)
    assert (rep.verdict.status, rep.verdict.variant, rep.verdict.tp) == (status, variant, tp), rep.verdict.summary


def test_every_system_is_sourced_and_detectable():
    names = system_names()
    for n in (
        "b200x8",
        "b300x8",
        "gb200x4",
        "gb300x4",
        "h100x8",
        "h200x8",
        "rtxpro6000x4",
        "rubinx8",
        "mi300xx8",
        "mi325xx8",
        "mi355xx8",
    ):
        assert n in names
    for key, spec in load_systems().systems.items():
        assert all(spec.sources[k] for k in ("gpu", "memory", "links", "driver")), key
        inv = inventory_for_system(key)
        assert inv.arch != "unknown" and len(inv.gpus) == spec.gpus and key in inv.label
        assert all(g.uuid is None for g in inv.gpus)  # per-host facts are not invented: plans use indices


def test_gpu_count_suffix_and_errors():
    two = inventory_for_system("b200x2")
    assert len(two.gpus) == 2 and [(lk.a, lk.b, lk.detail) for lk in two.links] == [(0, 1, "NV18")]
    assert resolve_system("MI300X-x4")[2] == 4 and resolve_system("mi300x8")[0] == "mi300x"
    with pytest.raises(UnknownSystem) as e:
        inventory_for_system("h200x16")
    assert "at most 8 GPUs" in e.value.message and "2 nodes" in e.value.message and "--nodes 2" in e.value.hint
    with pytest.raises(UnknownSystem) as e:
        inventory_for_system("gb200x8")
    assert "72 GPUs across nodes" in e.value.message
    with pytest.raises(UnknownSystem) as e:
        inventory_for_system("h300x8")
    assert "did you mean h200x8" in e.value.message and e.value.exit_code == 2
    with pytest.raises(UnknownSystem):
        inventory_for_system("b200x0")
    with pytest.raises(UnknownSystem, match="a GPU count is a positive number"):  # was read as h200x1
        resolve_system("h200x-1")


def test_catalog_schema_errors_name_the_key():
    bad_src = """schema_version: 1
systems:
  x:
    description: d
    vendor: nvidia
    gpu: {name: G, compute_capability: "9.0", memory_mib: 1}
    gpus: 1
    max_gpus: 1
    interconnect: {kind: pcie}
    driver_version: "1"
    cuda_driver_version: "13.0"
    sources: {gpu: a, links: b, driver: c}
"""
    with pytest.raises(CatalogError, match="systems.x.*sources needs memory"):
        load_systems(bad_src)
    with pytest.raises(CatalogError, match="unknown key 'systems.x.gpus_per_node'"):
        load_systems(bad_src.replace("max_gpus: 1", "max_gpus: 1\n    gpus_per_node: 1"))
    with pytest.raises(CatalogError, match="exactly one of compute_capability"):
        load_systems(bad_src.replace('compute_capability: "9.0"', 'gfx_target: gfx942, compute_capability: "9.0"'))


def test_kv_capacity_is_the_memory_rule_boundary():
    """The sizing view's KV capacity is the planner's own: a sequence of exactly that many tokens plans, one more
    token is rejected by memory.fit."""
    inv = inventory_for_system("h100x8")
    small = inv.model_copy(update={"gpus": tuple(g.model_copy(update={"memory_total_mib": 68000}) for g in inv.gpus)})
    p = plan(small, PlanRequest(model="MiniMax-M3.1-Flash", max_model_len=4096))
    t = p.memory_fit.capacity_tokens()
    assert 4096 < t < 524288
    at = dict(variant=p.variant, tp=p.tp, dp=p.dp, ep=p.ep, pp=p.pp, dcp=p.dcp)  # at the layout the search chose
    plan(small, PlanRequest(model="MiniMax-M3.1-Flash", max_model_len=t, **at))
    with pytest.raises(ConfigRejected, match="rule memory.fit"):
        plan(small, PlanRequest(model="MiniMax-M3.1-Flash", max_model_len=t + 1, **at))


def test_sizing_rows_are_the_planners_answers():
    rows = {
        r.system: r
        for r in size_systems(
            ["gb300x4", "rtxpro6000x4", "l40s"], PlanRequest(model="MiniMax-M3.1-Flash", max_model_len=131072)
        )
    }
    p = plan(
        inventory_for_system("gb300x4"), PlanRequest(model="MiniMax-M3.1-Flash", max_model_len=131072, runtime="auto")
    )
    g = rows["gb300x4"]
    assert g.serves and (g.variant, g.tp, g.dp, g.ep) == (p.variant, p.tp, p.dp, p.ep)
    assert g.kv_tokens == p.memory_fit.capacity_tokens() and g.concurrent_sequences == g.kv_tokens // 131072 > 0
    with pytest.raises(ConfigRejected) as e:
        plan(
            inventory_for_system("rtxpro6000x4"),
            PlanRequest(model="MiniMax-M3.1-Flash", max_model_len=131072, runtime="auto"),
        )
    r = rows["rtxpro6000x4"]
    assert not r.serves and e.value.message.startswith(f"rule {r.rule}:") and r.reason in e.value.message
    assert not rows["l40sx4"].serves and "no kernel profile for architecture 'ada'" in rows["l40sx4"].reason
    with pytest.raises(UnknownSystem):  # a bad name fails before anything is planned
        size_systems(["gb300x4", "nope"], PlanRequest(model="MiniMax-M3.1-Flash"))


def test_cli_plan_system_works_without_gpus():
    p = run_cli("plan", "--system", "gb300x4", "--model", "MiniMax-M3.1-Flash", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["profile"] == "blackwell-ultra" and d["layout"]["gpus"] == [0, 1, 2, 3]
    assert "catalog system gb300x4" in d["explain"][0]["why"]  # the catalog host, not this GPU-less one


def test_cli_system_errors_are_one_line():
    p = run_cli("plan", "--system", "h300x8")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines()[0] == "error: unknown system 'h300x8'; did you mean h200x8, h100x8, b300x8?"
    p = run_cli("doctor", "--system", "h200x16")
    assert p.returncode == 2 and "2 nodes" in p.stderr
    p = run_cli("plan", "--system", "b200x8", "--inventory", "x.json")
    assert p.returncode == 2 and "mutually exclusive" in p.stderr
    p = run_cli("tune", "--system", "b200x8", "--model", "MiniMax-M3.1-Flash")
    assert p.returncode == 2 and "--dry-run" in p.stderr


def test_cli_doctor_system_json():
    p = run_cli("doctor", "--system", "mi355xx8", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    d = json.loads(p.stdout)
    # runnable (exit 0) with the MI350 path's day-0 parts by their fallbacks
    assert d["verdict"]["status"] == "runnable_with_fallbacks" and d["verdict"]["variant"] == "mxfp4"


def test_cli_sizing_table_and_json():
    p = run_cli(
        "plan",
        "--model",
        "MiniMax-M3.1-Flash",
        "--max-model-len",
        "131072",
        "--systems",
        "gb300x4,rtxpro6000x4",
        "--systems",
        "h200x8",
        "--json",
    )
    assert p.returncode == 0, p.stderr
    rows = {r["system"]: r for r in json.loads(p.stdout)["systems"]}
    assert list(rows) == ["gb300x4", "rtxpro6000x4", "h200x8"]
    assert rows["gb300x4"]["serves"] and rows["gb300x4"]["max_model_len"] == 131072
    # the engine's answer for SM120 (no native MSA kernels; MXFP8 unsupported there: N08), as `plan --system` says
    assert rows["rtxpro6000x4"]["rule"] == "variant.native"
    one = json.loads(run_cli("plan", "--system", "h200x8", "--max-model-len", "131072", "--json", check=True).stdout)
    h = rows["h200x8"]
    assert (h["variant"], h["tp"], h["dp"], h["ep"]) == (
        one["variant"],
        one["layout"]["tp"],
        one["layout"]["dp"],
        one["layout"]["ep"],
    )
    t = run_cli("plan", "--max-model-len", "131072", "--systems", "all")
    assert t.returncode == 0 and all(n in t.stdout for n in system_names())
    assert "rtxpro6000x4: variant.native: variant 'nvfp4'" in t.stdout
    none = run_cli("plan", "--systems", "l40s")
    assert none.returncode == 3 and "no kernel profile" in none.stdout


def test_cli_doctor_of_a_catalog_system_does_not_read_as_probed():
    """A new user read "via nvml" and "NVML initialised; driver 580.159.04" for a system m3ctl only looked up, and
    "None CPUs" (the catalog lists no CPU count)."""
    p = run_cli("doctor", "--system", "h200x8")
    out = p.stdout
    assert "8 x NVIDIA H200 (hopper, sm_90) (catalog system)" in out
    assert "gpu.nvml_init               not probed (catalog system); typical driver" in out
    assert "NVML initialised" not in out and "None CPUs" not in out and "CPU count n/a" in out


def test_doctor_of_an_amd_catalog_system_reads_no_probe_of_this_machine():
    """`doctor --system mi300xx8 --runtime docker` on a laptop said "not runnable here: container.devices /dev/kfd
    and /dev/dri missing" (this machine's device nodes) while `plan --system mi300xx8 --runtime docker` planned it;
    without --runtime docker it warned that /opt/rocm was missing. The host probes are SKIP for a catalog system."""
    d = json.loads(run_cli("doctor", "--system", "mi300xx8", "--runtime", "docker", "--json").stdout)
    rows = {c["id"]: c for c in d["checks"]}
    for cid in ("container.engine", "container.nvidia_runtime", "container.devices", "driver.amdsmi"):
        assert (rows[cid]["status"], rows[cid]["message"]) == ("SKIP", "not probed (catalog system)")
    assert rows["driver.version"]["message"].startswith("not probed (catalog system)")
    assert d["runnable"] and d["exit_code"] == 0 and d["verdict"]["status"] == "runnable_with_fallbacks"  # day-0
    plan = json.loads(run_cli("plan", "--system", "mi300xx8", "--runtime", "docker", "--json", check=True).stdout)
    assert (plan["variant"], plan["layout"]["tp"]) == (d["verdict"]["variant"], d["verdict"]["tp"])
    assert not [
        c
        for c in json.loads(run_cli("doctor", "--system", "mi300xx8", "--json").stdout)["checks"]
        if c["status"] != "OK" and c["status"] != "SKIP" and c["group"] in ("driver", "container")
    ]


def test_cli_plan_options_of_another_form_are_refused_not_ignored():
    """`plan --nodes 3` without a multi-node --emit, and --hf-cache-hostpath without a Kubernetes one, were
    accepted and ignored (exit 0)."""
    p = run_cli("plan", "--system", "h200x8", "--nodes", "3")
    assert p.returncode == 2 and p.stderr.startswith("error: --nodes applies to --emit lws or --emit ray")
    p = run_cli("plan", "--system", "h200x8", "--hf-cache-hostpath", "/data/hf")
    assert p.returncode == 2 and "--hf-cache-hostpath applies to --emit k8s or --emit lws" in p.stderr
    assert run_cli("plan", "--system", "h200x8", "--emit", "lws", "--nodes", "3").returncode == 0
    assert run_cli("plan", "--system", "h200x8", "--emit", "k8s", "--hf-cache-hostpath", "/data/hf").returncode == 0


def test_cli_serve_mount_is_part_of_the_plan(tiny_models):
    """`serve --dry-run --mount H:C` with the process runtime exited 0 and the mount went nowhere; with the docker
    runtime the printed command lacked it. The mount is now planned: refused without docker, printed with it."""
    m = str(tiny_models["llama"])
    p = run_cli("serve", "--model", m, "--dry-run", "--mount", "/tmp:/x")
    assert p.returncode == 2 and "--mount needs the docker runtime" in p.stderr and "--runtime docker" in p.stderr
    p = run_cli(
        "serve",
        "--model",
        m,
        "--dry-run",
        "--skip-checks",
        "--runtime",
        "docker",
        "--image",
        "vllm/vllm-openai:v0",
        "--mount",
        "/tmp:/x",
    )
    assert p.returncode == 0, p.stderr
    assert "-v /tmp:/x:ro" in p.stdout


def test_the_sizing_api_refuses_an_empty_system_name():
    """``m3ctl.api.size_systems([","])`` sized every system (an empty item dropped, then nothing left meant all)."""
    from m3ctl import api
    from m3ctl.errors import BadInput

    for systems in ([","], ["h200x8,"], ["h200x8", " "], []):
        with pytest.raises(BadInput, match="empty"):
            api.size_systems(systems)
