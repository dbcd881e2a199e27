"""The validated content of m3ctl's packaged data files (m3ctl.catalog.registry.validated_cache_dir): a command
that only reads a packaged file builds no validator for its schema; an entry is used only for the same text, the
same schema and the same code (an edited file, an edited m3ctl or another release is validated anew); a corrupt
entry is replaced; a user's file is never kept; a cache m3ctl cannot write costs only the validation."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

import m3ctl
from m3ctl import catalog
from m3ctl.catalog import registry
from m3ctl.catalog.loader import _Strict
from m3ctl.errors import CatalogError
from m3ctl.hw.systems import SystemCatalog, load_systems

PKG = Path(m3ctl.__file__).parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory (``$XDG_CACHE_HOME``), the packaged files read anew before and after the test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    catalog._packaged.cache_clear()
    yield tmp_path / "cache" / "m3ctl" / "validated"
    catalog._packaged.cache_clear()


@pytest.fixture
def systems_copy(tmp_path, monkeypatch):
    """The packaged data files read from a copy (``data/systems.yaml``) that the test may edit."""
    root = tmp_path / "pkg"
    (root / "data").mkdir(parents=True)
    (root / "data/systems.yaml").write_text((PKG / "data/systems.yaml").read_text())
    monkeypatch.setattr(registry, "resources", SimpleNamespace(files=lambda _pkg: root))
    return root / "data/systems.yaml"


@pytest.fixture
def validations(monkeypatch):
    """The packaged files validated (their path, once per validation) while the test runs."""
    seen: list[str] = []
    validate = registry.parse_as

    def counting(path, text, where):
        seen.append(path)
        return validate(path, text, where)

    monkeypatch.setattr(registry, "parse_as", counting)
    return seen


def test_a_packaged_file_is_validated_once_and_read_back_from_the_cache(cache, systems_copy, validations):
    assert registry.validated_cache_dir() == cache
    first = catalog.data("data/systems.yaml", SystemCatalog)
    (entry,) = cache.glob("*.pickle")
    assert validations == ["data/systems.yaml"]
    catalog._packaged.cache_clear()
    again = catalog.data("data/systems.yaml", SystemCatalog)
    assert validations == ["data/systems.yaml"]  # read back, not validated a second time
    assert again == first and again is not first and type(again) is SystemCatalog
    assert again.model_dump() == first.model_dump()
    assert list(cache.glob("*.pickle")) == [entry]


def test_an_edited_data_file_is_validated_anew_not_read_from_the_cache(cache, systems_copy, validations):
    catalog.data("data/systems.yaml", SystemCatalog)
    systems_copy.write_text(systems_copy.read_text().replace("description:", "descripton:", 1))
    catalog._packaged.cache_clear()
    with pytest.raises(CatalogError, match=r"^m3ctl/data/systems\.yaml: unknown key 'systems\.h100\.descripton'"):
        catalog.data("data/systems.yaml", SystemCatalog)
    assert validations == ["data/systems.yaml"] * 2


def test_other_code_never_reads_an_entry_written_by_this_code(cache, systems_copy, validations, monkeypatch):
    catalog.data("data/systems.yaml", SystemCatalog)
    monkeypatch.setattr(registry, "_code_stamp", lambda: b"an edited schema, validator or another m3ctl release")
    catalog._packaged.cache_clear()
    catalog.data("data/systems.yaml", SystemCatalog)
    assert validations == ["data/systems.yaml"] * 2
    assert len(list(cache.glob("*.pickle"))) == 2


def test_the_code_stamp_follows_every_module_of_m3ctl(tmp_path):
    assert registry._code_stamp() == registry.tree_stamp(PKG)
    (tmp_path / "sub").mkdir()
    module, schema = tmp_path / "sub" / "owner.py", tmp_path / "schema.py"
    module.write_text("x = 1\n")
    schema.write_text("y = 2\n")
    (tmp_path / "data.yaml").write_text("not code\n")
    stamp = registry.tree_stamp(tmp_path)
    assert registry.tree_stamp(tmp_path) == stamp  # the same code, the same stamp
    (tmp_path / "data.yaml").write_text("other text: not code\n")
    assert registry.tree_stamp(tmp_path) == stamp
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a module in a subfolder, touched
    touched = registry.tree_stamp(tmp_path)
    assert touched != stamp
    schema.write_text("y = 22\n")  # another size
    assert registry.tree_stamp(tmp_path) not in (stamp, touched)


@pytest.mark.parametrize("blob", [b"", b"\x00not a pickle", pickle.dumps({"systems": {}}), pickle.dumps(3)])
def test_a_corrupt_or_foreign_entry_is_replaced_by_a_fresh_validation(cache, systems_copy, validations, blob):
    good = catalog.data("data/systems.yaml", SystemCatalog)
    (entry,) = cache.glob("*.pickle")
    entry.write_bytes(blob)
    catalog._packaged.cache_clear()
    assert catalog.data("data/systems.yaml", SystemCatalog) == good
    assert validations == ["data/systems.yaml"] * 2
    assert pickle.loads(entry.read_bytes()) == good


def test_a_cache_m3ctl_cannot_write_only_costs_the_validation(tmp_path, monkeypatch, systems_copy):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    catalog._packaged.cache_clear()
    try:
        assert catalog.data("data/systems.yaml", SystemCatalog).systems
    finally:
        catalog._packaged.cache_clear()


def test_a_users_file_is_validated_every_time_and_never_kept(cache):
    text = (PKG / "data/systems.yaml").read_text()
    assert load_systems(text).systems
    assert not cache.exists()
    with pytest.raises(CatalogError, match="unknown key"):
        load_systems(text.replace("description:", "descripton:", 1))


def test_data_file_schemas_build_their_validator_on_first_use():
    assert _Strict.model_config.get("defer_build") is True
    assert SystemCatalog.model_config.get("defer_build") is True
