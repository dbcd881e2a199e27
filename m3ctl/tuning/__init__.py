"""``m3ctl tune``: measured, resumable search over restart knobs (TP, DCP, DBO/EP, speculation depth,
batching) under a latency SLO. See :mod:`m3ctl.tuning.search` for the algorithm."""
