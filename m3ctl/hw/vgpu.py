"""NVIDIA vGPU profiles, recognised from the GPU's marketing name.

A GPU handed to a VM through NVIDIA vGPU reports the *profile* as its name: the physical board, a dash,
the frame buffer in GB and the series letter, e.g. ``NVIDIA H200-141C`` (C: compute), ``NVIDIA L40S-48Q``
(Q: virtual workstation), ``GRID A100-40C``; MIG-backed profiles add the slice, ``NVIDIA H100XM-1-10C``.
Source: NVIDIA Virtual GPU Software User Guide, "Virtual GPU Types" (naming convention
``<board>-<framebuffer><series>``), https://docs.nvidia.com/vgpu/latest/grid-vgpu-user-guide/index.html.
On such GPUs peer-to-peer access and vLLM's custom all-reduce are not validated (N02 in docs/sources.md#n02:
https://github.com/vllm-project/vllm/issues/50557).
"""

from __future__ import annotations

import re

# Series letters: A (virtual applications), B (virtual PC), C (compute), Q (virtual workstation).
_VGPU = re.compile(r"-(?:\d+-)?(\d+)([ABCQ])$")


def vgpu_profile(name: str) -> str | None:
    """The vGPU profile suffix of a GPU name (``"141C"`` for ``NVIDIA H200-141C``), or None for a full GPU."""
    m = _VGPU.search(name.strip())
    return m.group(0)[1:] if m else None
