"""The one rule registry: named checks run on every launch plan (plan, serve, tune, doctor's verdict).

Each rule is declared with ``@rule(id)``, takes a :class:`PlanContext` and returns a :class:`Finding` (or None):
``rule`` (its id), ``status`` (``FAIL`` rejects the plan, exit 3; ``WARN`` is shown with it), ``message``, ``fix``
and ``source``. A rejection is a :class:`~m3ctl.errors.ConfigRejected` carrying that outcome
(:func:`rejection`). The rules encode vLLM constraints that vLLM itself only raises at engine init, often after
minutes of weight loading. Every rule sees raw flags in every spelling (typed knob, ``--x-config`` JSON, dotted
``--x-config.key``). A finding doctor also shows (its row of the same id) comes from one function here that both
call (:func:`cuda_vs_driver`, :func:`known_bad`, :func:`known_issue`, :func:`visible_devices`).

The context is :mod:`m3ctl.assess.context`, the finding and the registry :mod:`m3ctl.assess.findings`; the rules
live by topic in ``rules_model`` (model and engine), ``rules_layout`` (parallel layout, speculation, batching),
``rules_memory`` (weights and KV cache), ``rules_image`` (image and environment) and ``rules_flags`` (raw vLLM
flags). This module is the registry's front: it imports them all, fixes their order and runs them.
"""

from __future__ import annotations

from m3ctl.assess import rules_flags, rules_image, rules_layout, rules_memory, rules_model
from m3ctl.assess.context import PlanContext, advisories
from m3ctl.assess.findings import RULES, Finding, Rule, rejection, rule, rule_ids
from m3ctl.assess.rules_flags import AUTO_OK, INT_FLAGS
from m3ctl.assess.rules_image import DEPRECATED_ENV, cuda_vs_driver
from m3ctl.assess.rules_memory import kv_dtypes_allowed
from m3ctl.assess.rules_model import known_bad, known_issue, visible_devices
from m3ctl.catalog.vllm_args import vllm_int

__all__ = [
    "AUTO_OK",
    "DEPRECATED_ENV",
    "INT_FLAGS",
    "RULES",
    "RULE_MODULES",
    "Finding",
    "PlanContext",
    "Rule",
    "advisories",
    "check_all",
    "cuda_vs_driver",
    "known_bad",
    "known_issue",
    "kv_dtypes_allowed",
    "rejection",
    "rule",
    "rule_ids",
    "run_rules",
    "visible_devices",
    "vllm_int",
]

#: The rule modules in the order their rules are declared: :data:`RULES` follows it (each module's rules in the
#: order they are written), whatever order the modules were first imported in.
RULE_MODULES = (rules_model, rules_layout, rules_memory, rules_image, rules_flags)
_ORDER = [m.__name__ for m in RULE_MODULES]
RULES.sort(key=lambda r: _ORDER.index(r[1].__module__))


def run_rules(ctx: PlanContext) -> list[Finding]:
    """Run every rule; return all findings (FAIL and WARN) in rule order, the ``flags.*`` rules (is each flag
    one vLLM knows, with a value it can read?) first: a misspelt flag or value explains the rest."""
    out = []
    for _, fn in sorted(RULES, key=lambda r: not r[0].startswith("flags.")):
        v = fn(ctx)
        if v is not None:
            out.append(v)
    return out


def check_all(ctx: PlanContext) -> list[Finding]:
    """The ``FAIL`` findings of :func:`run_rules` (empty when the plan is valid)."""
    return [f for f in run_rules(ctx) if f.status == "FAIL"]
