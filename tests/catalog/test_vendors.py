"""Vendor facts (m3ctl/catalog/vendors.py, m3ctl/data/vendors.yaml): one typed object per vendor, each fact sourced."""

from __future__ import annotations

from importlib import resources

import pytest

from m3ctl.catalog import _load, vendors
from m3ctl.errors import CatalogError


def _facts_of(obj):
    if isinstance(obj, vendors.Fact):
        yield obj
    elif isinstance(obj, vendors._Strict):
        for name in type(obj).model_fields:
            yield from _facts_of(getattr(obj, name))


def test_every_vendor_fact_names_a_public_source():
    t = vendors.table()
    assert set(t.vendors) == {"nvidia", "amd"}
    for v in t.vendors.values():
        fs = list(_facts_of(v))
        assert len(fs) >= 10 and all(f.source.startswith("https://") for f in fs)


def test_the_facts_the_renderers_planner_and_doctor_use():
    nv, amd = vendors.facts("nvidia"), vendors.facts("amd")
    assert vendors.facts(None) is None and vendors.facts("cpu") is None
    assert nv.visibility.env.value == "CUDA_VISIBLE_DEVICES" and nv.visibility.order_env.value == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID"
    }
    assert amd.visibility.env.value == "ROCR_VISIBLE_DEVICES"
    assert amd.visibility.unset.value == ["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"]
    assert amd.container.devices.value == ["/dev/kfd", "/dev/dri"] and amd.container.groups.value == ["video"]
    assert amd.container.security_opt.value == ["seccomp=unconfined"] and amd.container.device_request.value is None
    assert nv.container.device_request.value.capabilities == [["gpu"]] and nv.container.visibility_env.value is None
    assert nv.container.toolkit_runtime.value == "nvidia" and amd.container.toolkit_runtime.value is None
    assert (nv.k8s.resource.value, amd.k8s.resource.value) == ("nvidia.com/gpu", "amd.com/gpu")
    assert set(vendors.process_visibility_vars()) == {
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }


def test_schema_refuses_an_unsourced_or_misspelled_fact():
    text = resources.files("m3ctl").joinpath("data/vendors.yaml").read_text()
    with pytest.raises(CatalogError, match="https"):
        _load(text.replace("source: https://kubernetes.io", "source: http://kubernetes.io"), vendors.VendorTable, "x")
    with pytest.raises(CatalogError, match="security_opt"):
        _load(text.replace("security_opt:", "security_opts:", 1), vendors.VendorTable, "x")
