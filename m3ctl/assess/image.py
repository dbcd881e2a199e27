"""Facts about a serving image (catalog entry or a user's ``--image``): CUDA/ROCm toolkit, vLLM version and the
GPU architectures its kernels were built for, read from the image's labels and environment before launch.

Sources: NVIDIA CUDA base images set ``CUDA_VERSION`` and ``NVIDIA_REQUIRE_CUDA``
(https://gitlab.com/nvidia/container-images/cuda); vLLM's Dockerfile builds with ``TORCH_CUDA_ARCH_LIST``
(``torch_cuda_arch_list`` build argument, https://github.com/vllm-project/vllm/blob/main/docker/Dockerfile);
OCI labels ``org.opencontainers.image.version`` (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from m3ctl.catalog import Image
from m3ctl.hw.host import inspect_image_config


@dataclass
class ImageFacts:
    """The image a launch would use: name/reference, CUDA/ROCm and vLLM versions, kernel architectures.

    Attributes:
        cuda_archs: compute capabilities the kernels were built for (``["9.0", "10.0"]``); empty = unknown.
    """

    name: str
    reference: str = ""
    cuda_version: str | None = None
    rocm_version: str | None = None
    vllm_version: str | None = None
    cuda_archs: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [
            f"CUDA {self.cuda_version}" if self.cuda_version else "",
            f"ROCm {self.rocm_version}" if self.rocm_version else "",
            f"vLLM {self.vllm_version}" if self.vllm_version else "",
            f"archs {' '.join(self.cuda_archs)}" if self.cuda_archs else "",
        ]
        return ", ".join(p for p in parts if p) or "no version labels"

    def as_catalog_image(self):
        """A :class:`m3ctl.catalog.Image` view for the plan rules (image.cuda_vs_driver)."""
        ref = self.reference or self.name
        repo, digest, tag = ref, None, "user"
        if "@" in ref:
            repo, digest = ref.split("@", 1)
        elif ":" in ref.rsplit("/", 1)[-1]:
            repo, tag = ref.rsplit(":", 1)
        return Image(
            name=self.name,
            vendor="amd" if self.rocm_version else "nvidia",
            repository=repo,
            tag=tag,
            digest=digest,
            vllm_version=self.vllm_version or "unknown",
            cuda_version=self.cuda_version,
            rocm_version=self.rocm_version,
            archs=[],
        )


def image_facts_from_env(name: str, env: list[str], labels: Mapping[str, str] | None = None) -> ImageFacts:
    """Image facts from ``docker image inspect`` ``Config.Env`` (``CUDA_VERSION=12.4.1``,
    ``NVIDIA_REQUIRE_CUDA=cuda>=12.4 ...``, ``VLLM_VERSION``, ``TORCH_CUDA_ARCH_LIST``) and ``Config.Labels``."""
    kv = dict(e.split("=", 1) for e in env if "=" in e)
    labels = dict(labels or {})
    cuda = kv.get("CUDA_VERSION")
    req = kv.get("NVIDIA_REQUIRE_CUDA", "")
    if not cuda and "cuda>=" in req:
        cuda = req.split("cuda>=", 1)[1].split()[0]
    cuda = ".".join(cuda.split(".")[:2]) if cuda else None
    vllm = (
        kv.get("VLLM_VERSION")
        or labels.get("vllm.version")
        or labels.get("ai.vllm.version")
        or labels.get("org.opencontainers.image.version")
    )
    if vllm:
        vllm = vllm.lstrip("v").split("+")[0]
    archs = (kv.get("TORCH_CUDA_ARCH_LIST") or labels.get("torch_cuda_arch_list") or "").replace(";", " ")
    return ImageFacts(
        name=name,
        reference=name,
        cuda_version=cuda,
        rocm_version=kv.get("ROCM_VERSION"),
        vllm_version=vllm,
        cuda_archs=[a.replace("+PTX", "") for a in archs.split() if a],
    )


def inspect_user_image(ref: str, env: Mapping[str, str] | None = None) -> ImageFacts | None:
    """Facts of a local image through the container engine; None when the engine is unreachable or the image
    is not pulled (the plan then says it was not inspected)."""
    cfg = inspect_image_config(ref, env)
    if cfg is None:
        return None
    return image_facts_from_env(ref, list(cfg.get("Env") or []), cfg.get("Labels") or {})
