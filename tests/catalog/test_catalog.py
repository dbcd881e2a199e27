from __future__ import annotations

import pytest

from m3ctl import catalog
from m3ctl.errors import CatalogError


def test_builtin_catalog_loads():
    profs = catalog.profiles()
    assert profs["cpu"].arch == "cpu"
    assert profs["cpu"].serve_args["enforce-eager"] is True
    imgs = catalog.images()
    assert {i.vendor for i in imgs.values()} == {"nvidia", "amd"}
    assert imgs["vllm-openai-minimax-m3"].reference == "vllm/vllm-openai:minimax-m3"


def test_unknown_key_did_you_mean(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("schema_version: 1\nname: x\narch: cpu\nserve_arg: {}\n")
    with pytest.raises(CatalogError, match="unknown key 'serve_arg'; did you mean 'serve_args'"):
        catalog.load_profile_file(f)


def test_nested_unknown_key(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("schema_version: 1\nname: x\narch: cpu\nconstraints: {head_dims_in: [64]}\n")
    with pytest.raises(CatalogError, match="did you mean 'head_dim_in'"):
        catalog.load_profile_file(f)


def test_schema_version_and_yaml_errors(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("schema_version: 7\nname: x\narch: cpu\n")
    with pytest.raises(CatalogError, match="schema_version 7 is not supported"):
        catalog.load_profile_file(f)
    f.write_text("name: [unclosed\n")
    with pytest.raises(CatalogError, match="not valid YAML"):
        catalog.load_profile_file(f)
    with pytest.raises(CatalogError, match="cannot read profile"):
        catalog.load_profile_file(tmp_path / "missing.yaml")


def test_user_catalog_overrides_by_name(tmp_path, monkeypatch):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "cpu.yaml").write_text(
        "schema_version: 1\nname: cpu\narch: cpu\nserve_args: {max-model-len: 1024}\n"
    )
    prof = catalog.profile_for_arch("cpu", catalog_dir=str(tmp_path))
    assert prof.serve_args == {"max-model-len": 1024}


def test_a_user_catalog_that_is_not_a_directory_or_holds_one_is_one_line(tmp_path, monkeypatch):
    """Found by a new-user probe: M3CTL_CATALOG_DIR=/nonexistent was ignored unseen, and a directory named
    profiles/hopper.yaml ended in `internal error: IsADirectoryError`."""
    from m3ctl.cli import main
    from m3ctl.errors import BadInput

    with pytest.raises(BadInput, match="(catalog directory|M3CTL_CATALOG_DIR=).*/nope: not a directory"):
        catalog.profiles(catalog_dir=str(tmp_path / "nope"))
    monkeypatch.setenv("M3CTL_CATALOG_DIR", str(tmp_path / "nope"))
    assert main(["plan", "--system", "h200x8"]) == 2
    monkeypatch.setenv("M3CTL_CATALOG_DIR", str(tmp_path))
    (tmp_path / "profiles" / "hopper.yaml").mkdir(parents=True)
    with pytest.raises(BadInput, match="catalog file .*hopper.yaml is a directory"):
        catalog.profiles(catalog_dir=str(tmp_path))
    assert main(["plan", "--system", "h200x8"]) == 2


def test_no_profile_for_arch():
    with pytest.raises(CatalogError, match="no kernel profile for architecture 'unknown'"):
        catalog.profile_for_arch("unknown")


def test_a_data_file_regex_that_does_not_compile_is_one_schema_error():
    """One Regex type (m3ctl.catalog.Regex) checks every pattern of the data files: log patterns, components."""
    from importlib import resources

    import yaml

    from m3ctl.serving.diagnose import load_components, load_patterns

    pats = yaml.safe_load(resources.files("m3ctl").joinpath("data/log_patterns.yaml").read_text())
    pats["patterns"][0]["regex"] = "(unclosed"
    with pytest.raises(CatalogError, match=r"patterns\.0\.regex: regex does not compile"):
        load_patterns(yaml.safe_dump(pats))
    comp = yaml.safe_load(resources.files("m3ctl").joinpath("data/components.yaml").read_text())
    comp["async_errors"]["errors"] = "[bad"
    with pytest.raises(CatalogError, match=r"async_errors\.errors: regex does not compile"):
        load_components(yaml.safe_dump(comp))
