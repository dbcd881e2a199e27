"""The one loader of packaged data (m3ctl.catalog.data): every packaged .yaml is registered with a schema by the
module that owns it, and validates; a broken file is one error line naming the file, the field path and what was
wrong."""

from __future__ import annotations

import ast
import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import BaseModel

import m3ctl
import m3ctl.assess.capability
import m3ctl.assess.engine_models
import m3ctl.assess.known_issues
import m3ctl.assess.peaks
import m3ctl.catalog.startup
import m3ctl.catalog.vendors
import m3ctl.catalog.vllm_args
import m3ctl.catalog.vllm_values
import m3ctl.core.secrets
import m3ctl.hw.host
import m3ctl.hw.systems
import m3ctl.planning.day0
import m3ctl.serving.diagnose
import m3ctl.serving.kernels
import m3ctl.serving.smoke
from m3ctl import catalog
from m3ctl.catalog import registry
from m3ctl.catalog.loader import load_yaml
from m3ctl.errors import CatalogError

from ..conftest import run_cli

PKG = Path(m3ctl.__file__).parent
PACKAGED = sorted(p.relative_to(PKG).as_posix() for p in PKG.rglob("*.yaml"))


def test_the_package_ships_the_data_files_this_test_enumerates():
    folders = {p.split("/")[0] for p in PACKAGED}
    assert {"data", "profiles", "images", "models"} <= folders and len(PACKAGED) >= 30, PACKAGED


@pytest.mark.parametrize("rel", PACKAGED)
def test_every_packaged_yaml_is_registered_with_a_schema_and_validates(rel):
    schema = catalog.schema_for(rel)
    assert isinstance(schema, type) and issubclass(schema, BaseModel)
    assert schema.model_config.get("extra") == "forbid", f"{rel}: {schema.__qualname__} accepts unknown keys"
    obj = catalog.data(rel, schema)
    assert isinstance(obj, schema)
    assert catalog.data(rel, schema) is obj  # cached: read and validated once
    # kept in the validated-data cache across runs (m3ctl.catalog.registry writes a fresh validation): a value
    # pickle cannot hold (a bare generic model such as vendors' Fact[str]) would make every run validate it again
    fresh = registry.parse_as(rel, (PKG / rel).read_text(), rel)
    assert pickle.loads(pickle.dumps(fresh, protocol=pickle.HIGHEST_PROTOCOL)) == fresh


def test_every_registry_entry_names_packaged_files_and_a_schema():
    for entry in catalog.registered():
        covered = [p for p in PACKAGED if catalog.data_file(p) is entry]
        assert covered, f"{entry.path} names no packaged file"
        assert "*" in entry.path or covered == [entry.path]
        assert issubclass(entry.schema, BaseModel)
        if entry.parser:
            assert callable(entry.parser)


def test_a_second_owner_of_a_file_is_refused():
    from m3ctl.catalog.vendors import VendorTable

    catalog.register("data/vendors.yaml", VendorTable)  # the owner again (a reload): accepted
    with pytest.raises(ValueError, match="registered already with schema m3ctl.catalog.vendors:VendorTable"):
        catalog.register("data/vendors.yaml", catalog.Profile)


def test_the_catalog_imports_no_owner_of_a_schema():
    """The owners register their files (no list of higher modules in the catalog, no import by string): the catalog
    imports only itself and m3ctl.errors. The one import by string is m3ctl.catalog.lazy's, of a third-party or
    standard-library module named where it is bound (no m3ctl module: every ``lazy_module`` call of the package)."""
    imported = set()
    for f in (PKG / "catalog").glob("*.py"):
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("m3ctl"):
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
        assert "import_module" not in f.read_text() or f.name == "lazy.py", f
    assert {m for m in imported if m.startswith("m3ctl")} <= {
        "m3ctl.catalog",
        "m3ctl.catalog.lazy",
        "m3ctl.catalog.loader",
        "m3ctl.catalog.registry",
        "m3ctl.catalog.vllm_args",
        "m3ctl.errors",
    }
    lazy = [
        node.args[0]
        for f in PKG.rglob("*.py")
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_module"
    ]
    assert lazy and all(isinstance(a, ast.Constant) and not a.value.startswith("m3ctl") for a in lazy)


@pytest.mark.parametrize("rel", PACKAGED)
def test_every_data_file_refuses_an_unknown_top_level_key(rel, tmp_path):
    copy = tmp_path / Path(rel).name
    copy.write_text((PKG / rel).read_text() + "\nbogus_kee: 1\n")
    with pytest.raises(CatalogError) as e:
        catalog.parse_as(rel, copy.read_text(), str(copy))
    assert e.value.message.startswith(f"{copy}: unknown key 'bogus_kee'"), e.value.message


def _broken_copy(tmp_path: Path, rel: str, edit) -> Path:
    data = yaml.safe_load((PKG / rel).read_text())
    edit(data)
    copy = tmp_path / Path(rel).name
    copy.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy


def _error(rel: str, copy: Path) -> CatalogError:
    with pytest.raises(CatalogError) as e:
        catalog.parse_as(rel, copy.read_text(), str(copy))
    assert "\n" not in e.value.message
    return e.value


def test_a_misspelt_key_inside_a_dict_of_models_says_did_you_mean(tmp_path):
    def edit(d):
        gpu = next(iter(d["systems"].values()))["gpu"]
        gpu["memory_mb"] = gpu.pop("memory_mib")

    copy = _broken_copy(tmp_path, "data/systems.yaml", edit)
    key = next(iter(yaml.safe_load(copy.read_text())["systems"]))
    err = _error("data/systems.yaml", copy)
    assert err.message == f"{copy}: unknown key 'systems.{key}.gpu.memory_mb'; did you mean 'memory_mib'?"
    assert err.hint == "fix the file; see the schema SystemCatalog in m3ctl/hw/systems.py"
    assert catalog._schema_hint(catalog.Profile).endswith("m3ctl/catalog/__init__.py")  # it named m3ctl/catalog.py


def test_a_misspelt_key_in_a_profile_section_says_did_you_mean(tmp_path):
    copy = _broken_copy(
        tmp_path,
        "profiles/cpu.yaml",
        lambda d: d["readiness"].update(startup_base=d["readiness"].pop("startup_base_s")),
    )
    err = _error("profiles/cpu.yaml", copy)
    assert err.message == f"{copy}: unknown key 'readiness.startup_base'; did you mean 'startup_base_s'?"


def test_a_misspelt_key_in_a_list_item_says_did_you_mean(tmp_path):
    def edit(d):
        d["fallbacks"][0]["meening"] = d["fallbacks"][0].pop("meaning")

    err = _error("data/kernel_patterns.yaml", _broken_copy(tmp_path, "data/kernel_patterns.yaml", edit))
    assert err.message.endswith(": unknown key 'fallbacks.0.meening'; did you mean 'meaning'?")


def test_a_wrong_value_names_the_field_and_quotes_the_value(tmp_path):
    def edit(d):
        next(iter(d["systems"].values()))["gpus"] = "eight"

    copy = _broken_copy(tmp_path, "data/systems.yaml", edit)
    key = next(iter(yaml.safe_load(copy.read_text())["systems"]))
    err = _error("data/systems.yaml", copy)
    assert err.message.startswith(f"{copy}: systems.{key}.gpus: Input should be a valid integer")
    assert err.message.endswith("(got 'eight')")


def test_a_missing_section_names_it(tmp_path):
    err = _error("data/host_cpus.yaml", _broken_copy(tmp_path, "data/host_cpus.yaml", lambda d: d.pop("grace")))
    assert err.message.endswith("host_cpus.yaml: grace: Field required")


def test_a_regex_error_is_the_field_and_the_reason_without_pydantics_prefix(tmp_path):
    def no_group(d):
        d["backends"][0]["regex"] = "Using \\w+ attention backend"

    err = _error("data/kernel_patterns.yaml", _broken_copy(tmp_path, "data/kernel_patterns.yaml", no_group))
    assert re.search(r"kernel_patterns\.yaml: backends\.0\.regex: regex has no \(\?P<name>\.\.\.\) group", err.message)

    def unclosed(d):
        d["runtime_jit"]["regex"] = "(unclosed"

    err = _error("data/kernel_patterns.yaml", _broken_copy(tmp_path, "data/kernel_patterns.yaml", unclosed))
    assert "runtime_jit.regex: regex does not compile" in err.message and "Value error" not in err.message


def test_invalid_yaml_a_list_and_a_newer_schema_version(tmp_path):
    copy = tmp_path / "vendors.yaml"
    copy.write_text("vendors: [unclosed\n")
    assert "vendors.yaml: not valid YAML" in _error("data/vendors.yaml", copy).message
    copy.write_text("- a\n- b\n")
    assert _error("data/vendors.yaml", copy).message == f"{copy}: expected a mapping at the top level"
    copy.write_text((PKG / "data/vendors.yaml").read_text().replace("schema_version: 1", "schema_version: 2"))
    assert "schema_version 2 is not supported" in _error("data/vendors.yaml", copy).message
    text = (PKG / "data/vendors.yaml").read_text()
    copy.write_text(text + "schema_version: 1\n")  # PyYAML kept the last of two keys with no word
    n = len(text.splitlines()) + 1
    assert _error("data/vendors.yaml", copy).message == (
        f"{copy}: not valid YAML: key 'schema_version' given twice (line {n}, column 1)"
    )


def test_a_schema_checks_across_entries(tmp_path):
    """known_issues.yaml: a workaround must name a fallback; capabilities.yaml: an architecture's feature must be
    one a precision, attention or KV-cache row needs (model validators: one line, no location prefix)."""

    def edit(d):
        d["issues"][0]["workaround"] = "no-such-fallback"

    copy = _broken_copy(tmp_path, "data/known_issues.yaml", edit)
    err = _error("data/known_issues.yaml", copy)
    issue = yaml.safe_load(copy.read_text())["issues"][0]["id"]
    assert err.message.startswith(
        f"{copy}: issue {issue}: workaround 'no-such-fallback' is not a fallback (fallbacks: "
    )

    def misspell(d):
        arch = next(a for a, row in d["archs"].items() if "nvfp4_moe" in row["features"])
        d["archs"][arch]["features"]["nvfp4_mo"] = d["archs"][arch]["features"].pop("nvfp4_moe")

    copy = _broken_copy(tmp_path, "data/capabilities.yaml", misspell)
    err = _error("data/capabilities.yaml", copy)
    assert re.fullmatch(
        rf"{re.escape(str(copy))}: archs\.[\w-]+\.features: unknown feature 'nvfp4_mo'; did you mean 'nvfp4_moe'\?",
        err.message,
    ), err.message


def test_an_owner_parser_keeps_its_hint(tmp_path):
    """vllm_models.yaml is generated: its registered parser's error says how to regenerate it."""
    copy = _broken_copy(tmp_path, "data/vllm_models.yaml", lambda d: d.update(versions={"1.0": {"source": "x"}}))
    err = _error("data/vllm_models.yaml", copy)
    assert err.message.startswith(f"{copy}: versions.1.0.") and err.hint == "regenerate it: m3ctl dev vllm-models"


def test_data_reads_the_packaged_file_and_names_it(tmp_path, monkeypatch):
    """A broken packaged file fails on first use, named as m3ctl/<path>; the loader reads through
    importlib.resources (here pointed at a tmp copy of the package's data)."""
    from m3ctl.catalog.vendors import VendorTable

    (tmp_path / "data").mkdir()
    text = (PKG / "data/vendors.yaml").read_text().replace("visibility:", "visiblity:", 1)
    (tmp_path / "data/vendors.yaml").write_text(text)
    monkeypatch.setattr(registry, "resources", SimpleNamespace(files=lambda _pkg: tmp_path))
    catalog._packaged.cache_clear()
    try:
        with pytest.raises(CatalogError, match=r"^m3ctl/data/vendors\.yaml: unknown key 'vendors\.\w+\.visiblity'; "):
            catalog.data("data/vendors.yaml", VendorTable)
        (tmp_path / "data/vendors.yaml").unlink()
        with pytest.raises(CatalogError, match=r"^m3ctl/data/vendors\.yaml: cannot read the packaged file"):
            catalog.data("data/vendors.yaml", VendorTable)
    finally:
        catalog._packaged.cache_clear()


def test_an_unregistered_path_or_a_wrong_schema_is_refused():
    from m3ctl.catalog.vendors import VendorTable
    from m3ctl.hw.systems import SystemCatalog

    with pytest.raises(CatalogError, match=r"m3ctl/data/sytems\.yaml: not a registered data file; did you mean "):
        catalog.data("data/sytems.yaml", SystemCatalog)
    with pytest.raises(TypeError, match="registered with schema m3ctl.hw.systems:SystemCatalog"):
        catalog.data("data/systems.yaml", VendorTable)
    with pytest.raises(CatalogError, match="not a registered data file"):
        catalog.data_file("profiles/nested/cpu.yaml")


def test_no_module_reads_packaged_data_around_the_catalog():
    """m3ctl.catalog.data is the one reader of packaged data files: no other module opens them itself."""
    readers = {
        p.relative_to(PKG.parent).as_posix()
        for p in PKG.rglob("*.py")
        if 'resources.files("m3ctl")' in p.read_text() and p.relative_to(PKG).as_posix() != "catalog/registry.py"
    }
    assert readers == set(), sorted(readers)


def test_a_whole_number_past_pythons_digit_limit_is_one_line(tmp_path):
    """A 5,000-digit integer in a YAML file raised a bare ValueError (Python's int digit limit)."""
    cfg = tmp_path / "big.yaml"
    cfg.write_text("port: " + "9" * 5000 + "\n")
    with pytest.raises(yaml.YAMLError, match="a whole number of 5,000 characters"):
        load_yaml(cfg.read_text())
    p = run_cli("plan", "--config", str(cfg))
    assert p.returncode == 2 and "a whole number of 5,000 characters" in p.stderr and "internal error" not in p.stderr
