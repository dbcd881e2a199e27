"""Which GPUs a server process will actually see, from the visible-device variables.

NVIDIA (``CUDA_VISIBLE_DEVICES``): comma-separated integer indices, full ``GPU-``/``MIG-`` UUIDs or
unique UUID prefixes; CUDA ignores everything after the first invalid entry; an empty value hides
every GPU; a process can use only one MIG slice. ``NVIDIA_VISIBLE_DEVICES`` is read by the container
runtime only (``all``/``none``/``void``/indices/UUIDs).
Sources: https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars ;
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/ (one MIG device per CUDA process);
https://github.com/vllm-project/vllm/issues/41848, /13815, /51677 (UUIDs crash vLLM's int() parsing).

AMD: ``ROCR_VISIBLE_DEVICES`` filters first (indices or ``GPU-<uuid>``), then ``HIP_VISIBLE_DEVICES``
(or ``CUDA_VISIBLE_DEVICES``) index into the already filtered list.
Sources: https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html ;
https://github.com/vllm-project/vllm/issues/12572 (F05).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from m3ctl.hw.inventory import GpuInfo, HostInventory


@dataclass(frozen=True)
class Unit:
    """One device a process can use: a GPU, or one MIG slice of it (memory is the slice's)."""

    gpu: int
    memory_mib: int | None
    label: str
    mig_uuid: str | None = None


@dataclass
class Visibility:
    """The effective device set and what is wrong with the variables.

    Attributes:
        units: devices the server will see, in order.
        problems: blocking findings (FAIL).
        warnings: risky but working settings (WARN).
        notes: how the set was computed (details).
        index_form: the same set as integer indices (what ``m3ctl serve`` passes to vLLM), when expressible.
    """

    units: list[Unit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    index_form: str | None = None
    controlled_by: list[str] = field(default_factory=list)


def _gpu_units(g: GpuInfo) -> list[Unit]:
    if g.mig_mode and g.mig_devices:
        return [
            Unit(g.index, m.memory_total_mib, f"GPU {g.index} MIG {m.name or m.index} ({m.uuid})", m.uuid)
            for m in g.mig_devices
        ]
    return [Unit(g.index, g.memory_total_mib, f"GPU {g.index} ({g.name})")]


def _tokens(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def _resolve_uuid(tok: str, gpus: tuple[GpuInfo, ...]) -> tuple[list[Unit], str | None]:
    """Units for a full or prefix ``GPU-``/``MIG-`` UUID; (units, problem)."""
    cands: list[tuple[str, list[Unit]]] = []
    for g in gpus:
        if g.uuid:
            cands.append((g.uuid, _gpu_units(g)))
        for m in g.mig_devices:
            cands.append(
                (
                    m.uuid,
                    [Unit(g.index, m.memory_total_mib, f"GPU {g.index} MIG {m.name or m.index} ({m.uuid})", m.uuid)],
                )
            )
    exact = [u for uid, u in cands if uid.lower() == tok.lower()]
    if exact:
        return exact[0], None
    pref = [(uid, u) for uid, u in cands if uid.lower().startswith(tok.lower())]
    if len(pref) == 1:
        return pref[0][1], None
    if len(pref) > 1:
        return [], f"{tok!r} is ambiguous: it prefixes {', '.join(uid for uid, _ in pref)}"
    return [], f"{tok!r} matches no GPU or MIG device UUID on this host"


def resolve_nvidia(inv: HostInventory) -> Visibility:
    """Effective CUDA device set (see module doc); validates NVIDIA_VISIBLE_DEVICES syntax too."""
    vis = Visibility()
    env = inv.visible_devices
    nvd = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvd is not None:
        vis.controlled_by.append("NVIDIA_VISIBLE_DEVICES")
        if nvd.strip().lower() in ("none", "void", ""):
            vis.notes.append(f"NVIDIA_VISIBLE_DEVICES={nvd!r}: a container started with it gets no GPU")
        elif nvd.strip().lower() != "all":
            for tok in _tokens(nvd):
                if not tok.isdigit():
                    _, prob = _resolve_uuid(tok, inv.gpus)
                    if prob:
                        vis.problems.append(f"NVIDIA_VISIBLE_DEVICES: {prob}")
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        for g in inv.gpus:
            vis.units += _gpu_units(g)
        vis.notes.append("CUDA_VISIBLE_DEVICES not set: every GPU NVML lists is visible")
        migs = [u for u in vis.units if u.mig_uuid]
        if len(migs) > 1:
            vis.warnings.append(
                f"{len(migs)} MIG slices are visible; a CUDA process uses only one "
                "(set CUDA_VISIBLE_DEVICES=<MIG UUID>)"
            )
        return vis
    vis.controlled_by.append("CUDA_VISIBLE_DEVICES")
    toks = _tokens(cvd)
    if not toks or toks[0] == "-1":
        vis.problems.append(f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU")
        return vis
    uses_uuid = False
    for i, tok in enumerate(toks):
        if tok.lstrip("-").isdigit():
            idx = int(tok)
            chosen = next((g for g in inv.gpus if g.index == idx), None)
            if chosen is None:
                vis.problems.append(
                    f"CUDA_VISIBLE_DEVICES entry {tok!r}: no GPU {idx} (this host has "
                    f"{len(inv.gpus)}); CUDA ignores it and every entry after it"
                )
                break
            vis.units += _gpu_units(chosen)[:1]
        else:
            uses_uuid = True
            units, prob = _resolve_uuid(tok, inv.gpus)
            if prob:
                vis.problems.append(f"CUDA_VISIBLE_DEVICES entry {i}: {prob}")
                break
            vis.units += units[:1]
    migs = [u for u in vis.units if u.mig_uuid]
    if len(migs) > 1:
        vis.problems.append(
            f"CUDA_VISIBLE_DEVICES selects {len(migs)} MIG slices; a CUDA process can use only "
            "one MIG device (run one server per slice)"
        )
    if uses_uuid and not vis.problems:
        if migs:
            vis.notes.append(
                "MIG UUIDs cannot be written as indices; m3ctl serve passes the UUID through "
                "(docker: --gpus device=<uuid>)"
            )
        else:
            vis.index_form = ",".join(str(u.gpu) for u in vis.units)
            vis.notes.append(
                f"UUID syntax resolved to indices {vis.index_form}; m3ctl serve passes indices to vLLM "
                "(vLLM versions before the UUID fix crash with int() on UUIDs, vllm#41848)"
            )
    return vis


def resolve_amd(inv: HostInventory) -> Visibility:
    """Effective HIP device set: ROCR_VISIBLE_DEVICES first, then HIP_ (else CUDA_) VISIBLE_DEVICES
    as indices into the filtered list (F05)."""
    vis = Visibility()
    env = inv.visible_devices
    set_vars: list[str] = [
        k for k in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES") if k in env
    ]
    vis.controlled_by = set_vars
    if len(set_vars) > 1:
        vis.warnings.append(
            f"{' and '.join(set_vars)} are all set: ROCR filters first, then HIP/CUDA index into "
            "the filtered list (double masking); m3ctl serve exports only one"
        )
    gpus = list(inv.gpus)
    if "ROCR_VISIBLE_DEVICES" in env:
        picked = []
        for tok in _tokens(env["ROCR_VISIBLE_DEVICES"]):
            if tok.isdigit():
                g = next((g for g in inv.gpus if g.index == int(tok)), None)
            else:
                g = next((g for g in inv.gpus if g.uuid and g.uuid.lower().startswith(tok.lower())), None)
            if g is None:
                vis.problems.append(f"ROCR_VISIBLE_DEVICES entry {tok!r} matches no GPU")
                continue
            picked.append(g)
        gpus = picked
        vis.notes.append(
            f"after ROCR_VISIBLE_DEVICES={env['ROCR_VISIBLE_DEVICES']}: {[g.index for g in gpus]} (physical)"
        )
    second = (
        "HIP_VISIBLE_DEVICES"
        if "HIP_VISIBLE_DEVICES" in env
        else ("CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in env else None)
    )
    if second:
        picked = []
        for tok in _tokens(env[second]):
            if not tok.isdigit() or int(tok) >= len(gpus):
                vis.problems.append(
                    f"{second} entry {tok!r} is out of range: only {len(gpus)} GPU(s) remain after "
                    "ROCR_VISIBLE_DEVICES, and indices are relative to them (HIP: invalid device ordinal)"
                )
                continue
            picked.append(gpus[int(tok)])
        gpus = picked
        vis.notes.append(f"after {second}={env[second]}: {[g.index for g in gpus]} (physical)")
    if not gpus and set_vars:
        vis.problems.append("the visible-device variables leave no GPU")
    for g in gpus:
        vis.units.append(Unit(g.index, g.memory_total_mib, f"GPU {g.index} ({g.name})"))
    return vis


def resolve(inv: HostInventory) -> Visibility:
    """The effective device set for the inventory's vendor (empty on a CPU host)."""
    if inv.vendor == "nvidia":
        return resolve_nvidia(inv)
    if inv.vendor == "amd":
        return resolve_amd(inv)
    return Visibility()
