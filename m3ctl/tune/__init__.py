"""``m3ctl tune``: measured, resumable search over restart knobs (TP, DCP, DBO/EP, speculation depth,
batching) under a latency SLO. See :mod:`m3ctl.tune.search` for the algorithm."""

from m3ctl import _api_module

_api_module(__name__)  # `m3ctl.tune(...)` calls m3ctl.api.tune (see m3ctl/__init__.py)
