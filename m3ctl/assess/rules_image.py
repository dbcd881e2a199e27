"""The plan rules on the image and the environment: the image's CUDA against the host driver, its kernels' compute
capabilities and its OCI platforms against the host, and deprecated vLLM environment variables."""

from __future__ import annotations

import re

from m3ctl.assess import capability
from m3ctl.assess.context import PlanContext
from m3ctl.assess.findings import Finding, finding, rule
from m3ctl.catalog import Image, images
from m3ctl.hw.host import host_cpus
from m3ctl.hw.inventory import HostInventory

DEPRECATED_ENV = {
    "VLLM_ATTENTION_BACKEND": "--attention-backend NAME (the env var is silently ignored since vLLM 0.26; "
    "vllm#50292, vllm PR #30564)",
    "VLLM_USE_FLASHINFER_MOE_FP4": "--moe-backend flashinfer_cutlass|flashinfer_trtllm (removed in v0.23; vllm PR #43148)",
    "VLLM_FLASHINFER_MOE_BACKEND": "--moe-backend NAME (removed in v0.23; vllm PR #43148)",
    "VLLM_NVFP4_GEMM_BACKEND": "--linear-backend NAME (vllm PR #49376)",
    "VLLM_ALL2ALL_BACKEND": "--all2all-backend NAME (https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/config/parallel.py)",
}


def cuda_vs_driver(img: Image | None, inventory: HostInventory) -> Finding | None:
    """The ``image.cuda_vs_driver`` finding for image ``img`` on ``inventory``'s driver (None when it runs or a
    version is unknown): the plan rule's, and doctor's row of the same id is a view of it. An image toolkit newer
    than the driver's CUDA is refused on every GPU: consumer GPUs fail with CUDA error 804, and datacenter GPUs
    run it only through the cuda-compat forward-compatibility libraries of supported driver branches, which
    m3ctl does not assume (https://docs.nvidia.com/deploy/cuda-compatibility/)."""
    have = inventory.cuda_driver_version
    if img is None or not img.cuda_version or not have:
        return None
    if capability.image_runs_on_driver(img.cuda_version, have):
        return None
    need = capability.min_driver_for_cuda(img.cuda_version)
    consumer = any(capability.is_consumer_gpu(g.name, g.brand) for g in inventory.gpus)
    alt, _ = capability.choose_image(inventory.vendor or "", inventory.arch, have)
    alt_name = alt.name if alt is not None and capability.image_runs_on_driver(alt.cuda_version, have) else None
    gpu = inventory.gpus[0].name if inventory.gpus else "this GPU"
    why = (
        f"forward compatibility does not work on {gpu} (CUDA error 804)"
        if consumer
        else "it would run only through the cuda-compat forward-compatibility libraries (datacenter GPUs, supported "
        "driver branches), which are not assumed"
    )
    fix = (
        (f"upgrade the driver to >= {need} (CUDA {img.cuda_version})" if need else "upgrade the driver")
        + (f", or use image {alt_name}" if alt_name else f"; no m3ctl-validated image has CUDA <= {have}")
        + ("" if consumer else "; --skip-checks to rely on forward compatibility")
    )
    return finding(
        "image.cuda_vs_driver",
        f"image {img.reference} needs CUDA {img.cuda_version}, the driver "
        f"{inventory.driver_version} supports up to CUDA {have}: {why}",
        fix,
        "field failure F06 (CUDA error 804); https://docs.nvidia.com/deploy/cuda-compatibility/; "
        + capability.table().cuda_min_driver.source,
    )


@rule("image.cuda_vs_driver")
def _cuda(c: PlanContext) -> Finding | None:
    return cuda_vs_driver(c.image, c.inventory) if c.runtime == "docker" else None


def _arch_min_cuda(vendor: str, arch: str) -> tuple[str | None, str | None]:
    """(the lowest CUDA among the catalog images listing ``arch``, the lowest CUDA of any of the vendor's catalog
    images): an arch whose first is higher than the second needs a newer toolkit than some images have (sm_103
    and sm_107: CUDA 13 builds only)."""
    imgs = [i for i in images().values() if i.vendor == vendor and i.cuda_version]
    key = capability._vtuple
    for_arch = sorted((i.cuda_version for i in imgs if arch in i.archs), key=key)
    every = sorted((i.cuda_version for i in imgs), key=key)
    return (for_arch[0] if for_arch else None), (every[0] if every else None)


@rule("image.archs")
def _image_archs(c: PlanContext) -> Finding | None:
    """The image's kernels against the GPU: a catalog image must list the profile's architecture; a user image
    with ``TORCH_CUDA_ARCH_LIST`` must include the GPU's compute capability; one without it is refused on an
    architecture that the catalog serves only from newer CUDA builds when its CUDA is older, and warned about
    when its CUDA is unknown or new enough (the kernels cannot be checked)."""
    if c.runtime != "docker" or not c.inventory.gpus or c.image is None and not c.image_archs:
        return None
    src = (
        "image env TORCH_CUDA_ARCH_LIST (vllm docker/Dockerfile torch_cuda_arch_list, "
        "https://github.com/vllm-project/vllm/blob/main/docker/Dockerfile); catalog images m3ctl/images/"
    )
    arch = c.profile.arch
    if c.image is not None and c.image.archs and arch not in c.image.archs:
        return finding(
            "image.archs",
            f"catalog image {c.image.name} is not built for {arch} (it lists {', '.join(c.image.archs)})",
            "drop --image (the profile's image), or use a catalog image for this architecture",
            src,
        )
    cc = c.inventory.gpus[0].compute_capability
    if not cc:
        return None
    if not c.image_archs:
        if c.image is None or c.image.archs or c.inventory.vendor != "nvidia":
            return None  # a catalog image (checked above), or not an NVIDIA user image
        need, lowest = _arch_min_cuda("nvidia", arch)
        if not need or not lowest or not capability.version_lt(lowest, need):
            return None
        have = c.image.cuda_version
        sm = f"sm_{cc.replace('.', '')}"
        if have and capability.version_lt(have, need):
            return finding(
                "image.archs",
                f"image {c.image.reference} lists no TORCH_CUDA_ARCH_LIST and is a CUDA {have} "
                f"build: {arch} ({sm}) kernels need a CUDA >= {need} build, so vLLM would die "
                "with 'no kernel image is available'",
                f"use an image built with CUDA >= {need} and {cc} in TORCH_CUDA_ARCH_LIST, or drop --image",
                src,
            )
        return finding(
            "image.archs",
            f"image {c.image.reference} lists no TORCH_CUDA_ARCH_LIST: whether it has {arch} "
            f"({sm}) kernels cannot be checked (the catalog serves {arch} only from CUDA >= "
            f"{need} builds)",
            f"check the image was built for {cc}, or drop --image",
            src,
            status="WARN",
        )
    built = {re.sub(r"[^0-9.]", "", a) for a in c.image_archs}
    if cc in built:
        return None
    return finding(
        "image.archs",
        f"the image's kernels are built for compute capability {', '.join(sorted(built))}, not "
        f"{cc} ({c.inventory.gpus[0].name}): vLLM dies with 'no kernel image is available'",
        "use the catalog image (drop --image) or an image built with this architecture in TORCH_CUDA_ARCH_LIST",
        "image env TORCH_CUDA_ARCH_LIST (vllm docker/Dockerfile torch_cuda_arch_list); docs/sources.md#vllm-image-tags "
        "(sm_103 on a CUDA 12.9 build: no kernel image)",
    )


@rule("image.platform")
def _image_platform(c: PlanContext) -> Finding | None:
    """The host CPU architecture (inventory ``cpu_arch``: aarch64 on Grace) against the image's published
    platforms (catalog ``platforms``; not checked when either is unknown)."""
    img, arch = c.image, c.inventory.cpu_arch
    if c.runtime != "docker" or img is None or not getattr(img, "platforms", None) or not arch:
        return None
    want = host_cpus().oci_platforms.get(arch)
    if want is None or want in img.platforms:
        return None
    grace = " (NVIDIA Grace)" if c.inventory.grace else ""
    return finding(
        "image.platform",
        f"image {img.reference} is published for {', '.join(img.platforms)}, not {want}: the "
        f"host CPU is {arch}{grace}; docker refuses it ('exec format error')",
        f"use an image built for {want} (--image), or --runtime process with a vLLM built for {arch}",
        "m3ctl/data/host_cpus.yaml oci_platforms (OCI image index platform); image catalog platforms",
    )


@rule("env.deprecated")
def _env(c: PlanContext) -> Finding | None:
    for k in c.env:
        if k in DEPRECATED_ENV:
            return finding(
                "env.deprecated",
                f"environment variable {k} is deprecated or ignored by vLLM",
                f"use {DEPRECATED_ENV[k]}",
                "https://github.com/vllm-project/vllm/pull/43148",
            )
    return None
