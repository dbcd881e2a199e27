"""Did a closed-loop run decode at one steady pace? The bench's check for a run disturbed part of the way through.

At a fixed concurrency every request of a steady run decodes at the same pace, whenever it starts: its TPOT is drawn
from one distribution. A run that something else disturbed for a while (another process on the GPU or the host, a
noisy neighbour, a server still warming up, all users started at once so the first wave prefills together) has two
paces, and its median belongs to neither. Recorded case: one H200 host stepped one user of the MiniMax-M3 scale model
at about 1.95 ms for the first 36 of 100 requests and about 1.45 ms after (quarter medians 1.94, 1.98, 1.55, 1.46 ms),
where a clean host's quarters agree within 0.3 % (tests/fixtures/estimate-fit, docs/results/estimate-fit.md).

The check: the requests in start order cut into :data:`BLOCKS` consecutive blocks of equal size; the run is
disturbed when the blocks' median TPOTs differ by more than :data:`SHIFT` of the lowest AND by more than
:data:`Z` standard errors of a block median (the run's own noise: 1.2533 x the robust standard deviation of its
TPOTs about their own block's median / sqrt(block size), times sqrt(2) for a difference; about the block's median, so
a shift does not widen the noise it is judged against). Both, because a clean run of tight TPOTs shows a few
per cent between quarters that is statistically real but no disturbance (c = 64 on a clean host: up to 5 %), and a
run of widely spread TPOTs shows large differences by chance. Judged only where each block holds at least
:data:`MIN_BLOCK` requests and two waves of the concurrency (fewer would compare the ramp-up with the rest).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Consecutive blocks a run's requests are cut into, in start order.
BLOCKS = 4
#: The fewest requests a block holds for the run to be judged (and at least two waves of the concurrency).
MIN_BLOCK = 8
#: The shift between the highest and lowest block median TPOT, as a fraction of the lowest, above which a run is
#: disturbed (when also beyond :data:`Z`). Calibrated on the recorded Hopper runs of tests/fixtures it judges (91
#: runs of the MiniMax-M3 scale and floor models, 2026-12-01 to 12-07, the last with the check live in the bench):
#: those whose quarters show one pace shift 0.0 to 13.7 %, those with a visible change of pace (a slow first third,
#: a slow spell, lockstep starts) 16.6 to 186 %; any threshold from 14 to 16.5 % leaves out the same 15 runs.
SHIFT = 0.15
#: Standard errors of the difference of two block medians the shift must also exceed.
Z = 3.0
#: A block median's standard error in units of the robust standard deviation / sqrt(n) (normal data: sqrt(pi / 2)).
_MEDIAN_SE = math.sqrt(math.pi / 2)


@dataclass(frozen=True)
class Pace:
    """The pace check of one run: ``block_medians_s`` (median TPOT of each block, s, in start order), ``shift``
    (highest block median / lowest - 1) and ``z`` (that difference in standard errors of a block-median difference;
    inf when the run's TPOTs have no spread)."""

    block_medians_s: tuple[float, ...]
    shift: float
    z: float

    @property
    def disturbed(self) -> bool:
        """The pace moved by more than :data:`SHIFT` and beyond the run's own noise (:data:`Z`)."""
        return self.shift > SHIFT and self.z > Z

    def as_dict(self) -> dict:
        """The result JSON's ``validity.decode_pace`` block (ms, %)."""
        return {
            "block_median_tpot_ms": [round(m * 1e3, 4) for m in self.block_medians_s],
            "shift_pct": round(self.shift * 100, 2),
            "z": round(self.z, 2) if math.isfinite(self.z) else None,
            "disturbed": self.disturbed,
        }

    def quarters_ms(self) -> str:
        """The block medians in ms, e.g. ``"1.94, 1.98, 1.55, 1.46"``."""
        return ", ".join(f"{m * 1e3:.2f}" for m in self.block_medians_s)

    def text(self) -> str:
        """The finding in words, for a disturbed run."""
        return (
            f"decode pace not steady: the median TPOT of each quarter of the requests (in start order) was "
            f"{self.quarters_ms()} ms, "
            f"a {self.shift:.0%} shift beyond the run's own noise; something disturbed part of the run (other "
            "work on the GPU or host, a server still warming up, or all users started at once): run it again"
        )


def pace(tpots_s: Sequence[float], concurrency: int) -> Pace | None:
    """The pace check (module docstring) of one closed-loop run's per-request TPOTs in start order (s); None when
    the run is too short to judge (a block under :data:`MIN_BLOCK` requests or two waves of ``concurrency``).

    >>> pace([0.002] * 50 + [0.0015] * 50, 1).disturbed
    True
    >>> pace([0.0015] * 100, 1).shift
    0.0
    >>> pace([0.0015] * 20, 4) is None
    True
    """
    n = len(tpots_s)
    size = n // BLOCKS
    if size < max(MIN_BLOCK, 2 * concurrency):
        return None
    blocks = [tpots_s[i * n // BLOCKS : (i + 1) * n // BLOCKS] for i in range(BLOCKS)]
    medians = tuple(statistics.median(b) for b in blocks)
    lo, hi = min(medians), max(medians)
    sd = 1.4826 * statistics.median(abs(t - m) for b, m in zip(blocks, medians, strict=True) for t in b)
    se = math.sqrt(2) * _MEDIAN_SE * sd / math.sqrt(size)
    z = (hi - lo) / se if se > 0 else (math.inf if hi > lo else 0.0)
    return Pace(medians, (hi - lo) / lo if lo > 0 else 0.0, z)
