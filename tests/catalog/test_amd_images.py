"""AMD images per GPU family: AMD publishes one vLLM ROCm image per family (gfx94x = MI300X/MI325X, gfx950 =
MI350X/MI355X). The catalog has one per family, selectable with --image and refused on the other family; a
profile's default is the confirmed image built for its family (the recipe's, built for both: the per-family tags at
the vLLM the model needs are assumed until confirmed). A process plan on an AMD host gets the environment its image
sets in its container (HIP_FORCE_DEV_KERNARG, SAFETENSORS_FAST_GPU...)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from m3ctl import api, catalog
from m3ctl.errors import ConfigRejected
from m3ctl.planning.emit import docker_command

SYSTEM_GFX = {"mi300xx8": "gfx942", "mi325xx8": "gfx942", "mi350xx8": "gfx950", "mi355xx8": "gfx950"}


def _arch_gfx() -> dict[str, set[str]]:
    """gfx targets of each architecture family (m3ctl/data/architectures.yaml)."""
    path = Path(catalog.__file__).parents[1] / "data" / "architectures.yaml"
    out: dict[str, set[str]] = {}
    for gfx, row in yaml.safe_load(path.read_text())["amd"].items():
        out.setdefault(row["family"], set()).add(gfx)
    return out


def test_every_amd_profile_defaults_to_a_confirmed_image_built_for_its_family():
    imgs = catalog.images()
    arch_gfx = _arch_gfx()
    amd = [p for p in catalog.profiles().values() if p.image and imgs[p.image].vendor == "amd"]
    assert {p.arch for p in amd} == {"cdna3", "cdna4"}
    for prof in amd:
        img = imgs[prof.image]
        assert arch_gfx[prof.arch] <= set(img.gfx_targets), (prof.name, img.name, img.gfx_targets)
        assert prof.arch in img.archs
        assert not img.assumed, f"{prof.name} defaults to {img.name}, whose {img.assumed} are not confirmed"


def test_every_amd_image_has_its_environment_and_sources():
    for img in catalog.images().values():
        if img.vendor != "amd":
            continue
        assert img.gfx_targets and img.sources.get("gfx_targets", img.sources.get("tag")), img.name
        assert {"HIP_FORCE_DEV_KERNARG": "1", "SAFETENSORS_FAST_GPU": "1"}.items() <= img.env.items(), img.name
        assert "https://" in img.sources["env"], img.name
        if img.assumed:  # what is assumed says what would confirm it
            assert "docker manifest inspect" in img.sources["assumed"], img.name


@pytest.mark.parametrize("system", sorted(SYSTEM_GFX))
def test_a_docker_plan_for_an_amd_system_picks_the_image_of_its_family(system):
    p = api.plan(system=system, runtime="docker")
    img = catalog.find_image(p.image or "")
    assert img is not None and SYSTEM_GFX[system] in img.gfx_targets, (system, p.image)
    argv = shlex.split(docker_command(p))
    assert p.image == argv[argv.index("--entrypoint") + 2]
    assert "HIP_FORCE_DEV_KERNARG=1" not in argv  # a container has it from its image
    if img.assumed:
        assert any(w.startswith(f"image {img.name}: tag") and "assumed" in w for w in p.warnings)


def test_each_family_has_its_own_image_selectable_with_image_and_refused_on_the_other():
    imgs = [i for i in catalog.images().values() if i.vendor == "amd" and len(i.archs) == 1]
    by_arch = {i.archs[0]: i for i in imgs}
    assert set(by_arch) == {"cdna3", "cdna4"} and len(imgs) == 2
    assert by_arch["cdna3"].gfx_targets == ["gfx942"] and by_arch["cdna4"].gfx_targets == ["gfx950"]
    own = api.plan(system="mi355xx8", image=by_arch["cdna4"].name)
    assert own.image and "gfx950" in own.image
    assert any("assumed, not publicly confirmed" in w for w in own.warnings)
    with pytest.raises(ConfigRejected, match="rule image.archs"):
        api.plan(system="mi300xx8", image=by_arch["cdna4"].name)


def test_a_process_plan_on_an_amd_host_gets_the_image_environment():
    p = api.plan(system="mi355xx8", runtime="process")
    img = catalog.images()[catalog.profiles()[p.profile].image or ""]
    assert img.env.items() <= p.env.items(), p.env
    assert p.env["HIP_FORCE_DEV_KERNARG"] == "1" and p.env["SAFETENSORS_FAST_GPU"] == "1"
    assert p.env["VLLM_ROCM_USE_AITER"] == "1"  # the profile's env beside it
    assert any(c.what == "env" and "HIP_FORCE_DEV_KERNARG" in str(c.value) for c in p.choices)
    # the lowest layer: a request's env overrides it
    q = api.plan(system="mi355xx8", runtime="process", env={"SAFETENSORS_FAST_GPU": "0"})
    assert q.env["SAFETENSORS_FAST_GPU"] == "0" and q.env["HIP_FORCE_DEV_KERNARG"] == "1"


def test_a_process_plan_on_an_nvidia_host_gets_no_rocm_environment():
    p = api.plan(system="h200x8", runtime="process")
    assert "HIP_FORCE_DEV_KERNARG" not in p.env
