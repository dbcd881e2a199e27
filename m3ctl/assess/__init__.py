"""The one decision engine: can this model run here, how, with which flags, in how much memory.

- :mod:`m3ctl.assess.facts`: one :class:`~m3ctl.assess.facts.ModelFacts` (catalog spec + local config.json).
- :mod:`m3ctl.assess.capability`: one capability table (m3ctl/data/capabilities.yaml) and the image choice.
- :mod:`m3ctl.assess.memory`: one memory fit (weights + KV against usable GPU memory).
- :mod:`m3ctl.assess.rules`: one rule registry (findings with id, status, message, fix, source).
- :mod:`m3ctl.assess.request`: the typed :class:`~m3ctl.assess.request.PlanRequest` and its precedence.
- :mod:`m3ctl.assess.image`: facts of a serving image from its labels/env.

:func:`m3ctl.planning.plan.plan` is assess + render; doctor's verdict, serve and tune are views of it.
"""
