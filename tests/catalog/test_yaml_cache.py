"""The parsed-YAML cache of m3ctl's packaged data files (m3ctl.catalog.loader.yaml_cache_dir): one entry per
content, so an edited data file is parsed anew; only packaged files are cached (a user's file may carry a secret);
a cache m3ctl cannot write costs only the parse."""

from __future__ import annotations

import marshal
from pathlib import Path
from types import SimpleNamespace

import pytest

import m3ctl
from m3ctl import catalog
from m3ctl.catalog import loader, registry
from m3ctl.catalog.vendors import VendorTable
from m3ctl.errors import CatalogError

PKG = Path(m3ctl.__file__).parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory (``$XDG_CACHE_HOME``), the packaged files read anew before and after the test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    catalog._packaged.cache_clear()
    yield tmp_path / "cache" / "m3ctl" / "yaml"
    catalog._packaged.cache_clear()


@pytest.fixture
def package_copy(tmp_path, monkeypatch):
    """The packaged data files read from a copy (``data/vendors.yaml``) that the test may edit."""
    root = tmp_path / "pkg"
    (root / "data").mkdir(parents=True)
    (root / "data/vendors.yaml").write_text((PKG / "data/vendors.yaml").read_text())
    monkeypatch.setattr(registry, "resources", SimpleNamespace(files=lambda _pkg: root))
    return root / "data/vendors.yaml"


def _read_again(cache: Path) -> None:
    """The packaged files read anew, from their YAML: the in-process copy dropped and the validated-data entries
    beside the YAML cache (m3ctl.catalog.registry.validated_cache_dir) removed, else those answer without a parse."""
    catalog._packaged.cache_clear()
    for entry in (cache.parent / "validated").glob("*.pickle"):
        entry.unlink()


def test_a_packaged_file_is_parsed_once_per_content_and_read_back_from_the_cache(cache, package_copy):
    assert loader.yaml_cache_dir() == cache
    first = catalog.data("data/vendors.yaml", VendorTable)
    entries = list(cache.glob("*.marshal"))
    assert len(entries) == 1
    assert marshal.loads(entries[0].read_bytes()) == loader.load_yaml(package_copy.read_text())
    _read_again(cache)
    assert catalog.data("data/vendors.yaml", VendorTable) == first  # the cached parse validates to the same object
    assert list(cache.glob("*.marshal")) == entries


def test_an_edited_data_file_is_parsed_anew_not_read_from_the_cache(cache, package_copy):
    before = catalog.data("data/vendors.yaml", VendorTable)
    package_copy.write_text(package_copy.read_text().replace("visibility:", "visiblity:", 1))
    catalog._packaged.cache_clear()
    with pytest.raises(CatalogError, match=r"^m3ctl/data/vendors\.yaml: unknown key 'vendors\.\w+\.visiblity'"):
        catalog.data("data/vendors.yaml", VendorTable)  # the old content's parse is not used for the new text
    assert before is not None and len(list(cache.glob("*.marshal"))) == 2


def test_a_corrupt_cache_entry_is_replaced_by_a_fresh_parse(cache, package_copy):
    good = catalog.data("data/vendors.yaml", VendorTable)
    (entry,) = cache.glob("*.marshal")
    entry.write_bytes(b"\x00not marshal")
    _read_again(cache)
    assert catalog.data("data/vendors.yaml", VendorTable) == good
    assert marshal.loads(entry.read_bytes()) == loader.load_yaml(package_copy.read_text())


def test_a_cache_m3ctl_cannot_write_only_costs_the_parse(tmp_path, monkeypatch, package_copy):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory would be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    catalog._packaged.cache_clear()
    try:
        assert catalog.data("data/vendors.yaml", VendorTable).vendors
    finally:
        catalog._packaged.cache_clear()


def test_a_users_yaml_is_never_written_to_the_cache(cache):
    assert loader.load_yaml("api-key: sk-secret-value-123\n") == {"api-key": "sk-secret-value-123"}
    assert not cache.exists()
