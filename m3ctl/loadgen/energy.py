"""Energy of a bench run's measured phase: GPU power sampled in a background thread, reported per output token.

Which GPUs (:func:`choose_gpus`, the one place this is decided): ``power_gpus`` when named (``--power-gpus``);
else, with a GPU exporter's page (``--power-metrics URL``: DCGM or AMD, for GPUs on the server's host), every GPU
it lists (:class:`m3ctl.hw.power.ExporterPower`); else the GPUs of the m3ctl deployment behind the endpoint (its launch plan's ``gpus``, ``deployment_gpus``);
else, for an endpoint on this host, every local GPU the power interface reads; else none: a remote endpoint
with no GPUs named has no energy (its GPUs are not on this host). ``power=False`` (``--no-power``) samples nothing.

How (:class:`EnergyMeter`): the first reading is taken when the measured phase starts (after the warm-ups),
then one every ``power_interval_s`` (a CLI fallback: at most once a second), and one when the last request has
finished; the power interface is :func:`m3ctl.hw.power.open_power`. Per GPU, the energy of the measured window
(first send to last completion, the run's ``duration``) is the driver's energy counter delta where the GPU has
one (exact; linear between readings at the window's edges), else the trapezoid integral of the power readings
(NVML's power on Ampere and newer is a 1 s average, so the integral smooths transients); ``source`` and each
GPU's ``method`` say which. A reading that fails is skipped (counted in ``read_errors``); a GPU without a reading
at or before the window's start and at or after its end makes the run's energy n/a (its reason names the GPU and
the error), while the GPUs that were read keep their figures in ``per_gpu``. Missing is null, never 0.

The result's ``energy`` block (:meth:`EnergyMeter.block`): ``source`` (``nvml-energy-counter``,
``nvml-power-samples``, ``amdsmi-energy-counter``, ``amdsmi-power-samples``, ``nvidia-smi-power-samples``,
``rocm-smi-power-samples``, ``<interface>-energy-counter+power-samples`` when GPUs differ; None when n/a),
``gpus`` (indices), ``gpus_source``, ``interval_s``, ``duration_s`` (s), ``joules`` (J, all GPUs),
``avg_w_per_gpu`` (W), ``joules_per_output_token`` (J), ``output_tokens_per_joule``, ``total_tokens_per_joule``
(input + output), ``samples`` (sampling rounds inside the window), ``per_gpu`` ([{gpu, method, joules, avg_w,
max_w, samples, read_errors, error}]) and ``reason`` (why n/a, else None).

Sources: NVML and amdsmi units and calls in :mod:`m3ctl.hw.power`
(https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html,
https://rocm.docs.amd.com/projects/amdsmi/en/latest/).
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from m3ctl.errors import BadInput
from m3ctl.hw.detect import ProbeDeclined
from m3ctl.hw.power import PowerReading, PowerSource, open_power

DEFAULT_INTERVAL_S = 0.1
_LOOPBACK = {"localhost", "::1", "0.0.0.0", "::", ""}


@dataclass(frozen=True)
class GpuChoice:
    """The GPUs to sample: ``gpus`` (None: every GPU the interface reads), where that came from (``source``), and
    ``reason`` when nothing is sampled."""

    gpus: list[int] | None
    source: str | None
    reason: str | None = None


def is_local(url: str) -> bool:
    """The endpoint's host is this machine: a loopback or bind-all address, ``localhost``, or this host's name."""
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return False
    if host in _LOOPBACK or host.startswith("127."):
        return True
    names = {socket.gethostname().lower()}
    try:
        names.add(socket.getfqdn().lower())
    except OSError:
        pass
    return host in names


def choose_gpus(
    power: bool,
    power_gpus: Sequence[int] | None,
    deployment_gpus: Sequence[int] | None,
    deployment: str | None,
    url: str,
    exporter: str | None = None,
) -> GpuChoice:
    """Which GPUs a run samples (see the module docstring for the order)."""
    if not power:
        return GpuChoice([], None, "power sampling off (--no-power)")
    if power_gpus:
        return GpuChoice(sorted(set(power_gpus)), "--power-gpus")
    if exporter:
        return GpuChoice(None, f"every GPU of the exporter {exporter}")
    if deployment_gpus is not None:
        where = f"deployment {deployment}" if deployment else "the deployment"
        if not deployment_gpus:
            return GpuChoice([], where, f"{where} runs on no GPU (its launch plan names none)")
        return GpuChoice(sorted(set(deployment_gpus)), f"{where} (its launch plan's GPUs)")
    if not is_local(url):
        host = urlsplit(url).hostname
        return GpuChoice(
            [],
            None,
            f"the endpoint's host {host} is not this machine and no GPUs were named: its GPUs "
            "cannot be read from here (run bench on the GPU host, or name them with --power-gpus)",
        )
    return GpuChoice(None, "all local GPUs")


def _interp(pts: list[tuple[float, float]], t: float) -> float:
    """The piecewise-linear value of ``pts`` (time-sorted, covering ``t``) at ``t``."""
    for (ta, va), (tb, vb) in itertools.pairwise(pts):
        if ta <= t <= tb:
            return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)
    return pts[0][1] if t <= pts[0][0] else pts[-1][1]


def integrate(pts: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The integral over [t0, t1] of the piecewise-linear function through ``pts`` ((s, W), time-sorted, covering
    the interval): the trapezoid rule, exact for power that is linear between readings. Returns joules."""
    total = 0.0
    for (ta, wa), (tb, wb) in itertools.pairwise(pts):
        a, b = max(ta, t0), min(tb, t1)
        if b > a:
            total += (_interp([(ta, wa), (tb, wb)], a) + _interp([(ta, wa), (tb, wb)], b)) / 2 * (b - a)
    return total


def counter_delta(pts: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The energy counter's increase over [t0, t1] ((s, J) readings, time-sorted, covering the interval), linear
    between readings. Returns joules."""
    return _interp(pts, t1) - _interp(pts, t0)


def _covers(pts: list[tuple[float, float]], t0: float, t1: float) -> bool:
    return bool(pts) and pts[0][0] <= t0 and pts[-1][0] >= t1


def gpu_energy(series: list[tuple[float, PowerReading]], t0: float, t1: float, counter: bool) -> dict:
    """One GPU's energy over [t0, t1] from its readings ``(time s, reading)``: the counter delta when ``counter``
    and the counter readings cover the window, else the power integral when those cover it, else n/a.

    Returns:
        ``{"method": "energy-counter"|"power-samples"|None, "joules", "avg_w", "max_w", "samples",
        "read_errors", "error"}`` (J, W; None where not measured, ``error`` saying why).
    """
    watts = [(t, r.watts) for t, r in series if r.watts is not None]
    energy = [(t, r.energy_j) for t, r in series if r.energy_j is not None]
    errs = [(t, r.error) for t, r in series if r.error]
    inside = [w for t, w in watts if t0 <= t <= t1]
    out: dict[str, Any] = {
        "method": None,
        "joules": None,
        "avg_w": None,
        "max_w": max(inside) if inside else None,
        "samples": len(inside),
        "read_errors": len(errs),
        "error": None,
    }
    span = t1 - t0
    if counter and _covers(energy, t0, t1):
        j = counter_delta(energy, t0, t1)
        if j >= 0:
            out.update(method="energy-counter", joules=j)
        else:
            out["error"] = "the energy counter went backwards (driver reloaded?)"
    if out["method"] is None and _covers(watts, t0, t1):
        out.update(method="power-samples", joules=integrate(watts, t0, t1), error=None)
    if out["method"] is None and out["error"] is None:
        pts = watts or energy
        last = errs[-1][1] if errs else "no reading"
        if not pts:
            out["error"] = f"no reading ({last})"
        elif pts[0][0] > t0:
            out["error"] = f"no reading before the measured phase began ({last})"
        else:
            out["error"] = f"no reading after +{max(0.0, pts[-1][0] - t0):.2f} s of the measured phase ({last})"
    if out["joules"] is not None and span > 0:
        out["avg_w"] = out["joules"] / span
    return out


class EnergyMeter:
    """Samples the chosen GPUs over a run's measured phase and makes its ``energy`` block.

    Use: ``m = EnergyMeter.for_run(...)`` before the run; ``m.start()`` when the measured phase begins;
    ``m.stop()`` when the last request has finished (idempotent; closes the interface); ``m.block(window, ...)``.

    Args:
        choice: :func:`choose_gpus`'s answer. source: an open power interface, None when n/a (``reason`` says why).
        interval_s: sampling period (s); raised to the interface's ``min_interval_s``.
        clock: the clock of the run's timestamps (``time.perf_counter``, as the bench client's).
    """

    def __init__(
        self,
        choice: GpuChoice,
        source: PowerSource | None,
        reason: str | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.choice, self.source, self.reason, self.clock = choice, source, reason, clock
        self.gpus: list[int] = (
            (choice.gpus if choice.gpus is not None else list(source.gpus)) if source else (choice.gpus or [])
        )
        self.interval_s = max(interval_s, source.min_interval_s) if source else interval_s
        self.ticks: list[tuple[float, list[PowerReading]]] = []
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = self.stopped = False

    @classmethod
    def for_run(
        cls,
        *,
        power: bool = True,
        power_gpus: Sequence[int] | None = None,
        deployment_gpus: Sequence[int] | None = None,
        deployment: str | None = None,
        url: str = "",
        interval_s: float = DEFAULT_INTERVAL_S,
        exporter: str | None = None,
    ) -> EnergyMeter:
        """Choose the GPUs and open the power interface (:func:`m3ctl.hw.power.open_power`). No interface, or GPUs
        of a deployment this host does not have, give a meter whose block is n/a with the reason.

        Raises:
            BadInput: ``power_gpus`` names a GPU the interface does not read on this host.
        """
        choice = choose_gpus(power, power_gpus, deployment_gpus, deployment, url, exporter)
        if choice.reason:
            return cls(choice, None, choice.reason, interval_s)
        try:
            src = open_power(url=exporter) if exporter else open_power()
        except ProbeDeclined as e:
            where = "from the exporter" if exporter else "on this host"
            return cls(choice, None, f"no GPU power reading {where} ({e})", interval_s)
        missing = sorted(set(choice.gpus or []) - set(src.gpus))
        if missing:
            have = ", ".join(map(str, src.gpus))
            src.close()
            names = ",".join(map(str, missing))
            if choice.source == "--power-gpus":
                raise BadInput(
                    f"--power-gpus {names}: no such GPU {'on the exporter' if exporter else 'on this host'} "
                    f"({src.name} reads GPUs {have})",
                    "name GPUs of this host (e.g. --power-gpus 0), or pass --no-power",
                )
            return cls(
                choice,
                None,
                f"GPU {names} of {choice.source} not on this host ({src.name} reads GPUs {have})",
                interval_s,
            )
        return cls(choice, src, None, interval_s)

    # ---- sampling
    def _tick(self) -> None:
        if self.source is None:  # nothing to read: start() starts no sampling without a source
            return
        a = self.clock()
        try:
            rs = self.source.read(self.gpus)
        except Exception as e:  # noqa: BLE001 - a source must not raise; if one does, the round failed
            rs = [PowerReading(g, None, None, f"{type(e).__name__}: {e}") for g in self.gpus]
        self.ticks.append(((a + self.clock()) / 2, rs))

    def _loop(self) -> None:
        while not self._halt.wait(self.interval_s):
            self._tick()

    def start(self) -> None:
        """First reading now, then one every ``interval_s`` in a daemon thread (nothing without a source)."""
        if self.source is None or self.started:
            return
        self.started = True
        self._tick()
        self._thread = threading.Thread(target=self._loop, name="m3ctl-power", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Last reading now, end the thread, close the interface. Idempotent."""
        if self.stopped:
            return
        self.stopped = True
        if self._thread is not None:
            self._halt.set()
            self._thread.join()
            self._tick()
        if self.source is not None:
            self.source.close()

    # ---- the result
    def block(
        self, window: tuple[float, float] | None, output_tokens: int | None, total_tokens: int | None = None
    ) -> dict:
        """The result's ``energy`` block for the measured ``window`` ((t0, t1) on ``clock``; None: no request
        completed) and the run's token counts (see the module docstring for the keys)."""
        src = self.source
        out: dict[str, Any] = {
            "source": None,
            "interface": src.name if src else None,
            "gpus": self.gpus,
            "gpus_source": self.choice.source,
            "interval_s": self.interval_s if src else None,
            "duration_s": None,
            "joules": None,
            "avg_w_per_gpu": None,
            "joules_per_output_token": None,
            "output_tokens_per_joule": None,
            "total_tokens_per_joule": None,
            "samples": 0,
            "per_gpu": [],
            "reason": self.reason,
        }
        if src is None:
            return out
        if not self.ticks:
            out["reason"] = "the measured phase did not start (the run stopped during the warm-ups)"
            return out
        if window is None or window[1] <= window[0]:
            out["reason"] = "no request completed: the measured phase has no span"
            return out
        t0, t1 = window
        out["duration_s"] = t1 - t0
        out["samples"] = sum(1 for t, _ in self.ticks if t0 <= t <= t1)
        per = []
        for i, g in enumerate(self.gpus):
            series = [(t, rs[i]) for t, rs in self.ticks]
            per.append({"gpu": g, **gpu_energy(series, t0, t1, g in src.has_counter)})
        out["per_gpu"] = per
        bad = [p for p in per if p["joules"] is None]
        if bad:
            out["reason"] = "; ".join(f"GPU {p['gpu']}: {p['error']}" for p in bad) + (
                ": the run's energy is incomplete"
                + (" (per_gpu keeps the GPUs that were read)" if len(bad) < len(per) else "")
            )
            return out
        methods = sorted({p["method"] for p in per}, key=lambda m: m != "energy-counter")
        out["source"] = f"{src.name}-" + "+".join(methods)
        joules = sum(p["joules"] for p in per)
        out["joules"] = joules
        out["avg_w_per_gpu"] = joules / (t1 - t0) / len(per)
        if output_tokens and joules > 0:
            out["joules_per_output_token"] = joules / output_tokens
            out["output_tokens_per_joule"] = output_tokens / joules
        if total_tokens and joules > 0:
            out["total_tokens_per_joule"] = total_tokens / joules
        return out


def measured_window(outs: Sequence[Any], duration: float) -> tuple[float, float] | None:
    """The measured phase on the client's clock: (last completion - ``duration``, last completion), None when no
    request completed (``duration`` is first send to last completion, as the run's ``duration``)."""
    ends = [o.end_time for o in outs if getattr(o, "start_time", None)]
    if not ends or duration <= 0:
        return None
    t1 = max(ends)
    return t1 - duration, t1
