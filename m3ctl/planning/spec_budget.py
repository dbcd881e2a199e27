"""The token budget of a speculative plan: ``--max-num-batched-tokens`` raised, where vLLM's default is too small, so
that every sequence the server admits can decode in one step with its draft tokens.

vLLM charges a decoding request at speculation depth K ``1 + K`` verify tokens plus its method's drafting slots
(``SpeculativeConfig.max_num_new_slots_for_drafting``: DSpark K - 1) against ``max_num_batched_tokens`` every step
(vLLM 0.32: the scheduler's input budget; vLLM 0.26: ``max_num_scheduled_tokens = max_num_batched_tokens -
max_num_seqs x slots``, with the warning "max_num_scheduled_tokens is set to 2048 based on the speculative decoding
settings" that a DSpark depth-7 start on an H100 logged at the 8192 default). Both read the same: the default lets
at most ``max_num_batched_tokens // (1 + K + slots)`` sequences decode at once, so a plan with speculation that
leaves the budget unset sets it to ``max_num_seqs x (1 + K + slots)`` where that is larger than the default. The
slots per method are data (m3ctl/data/vllm_defaults.yaml ``draft_slots``, with the vLLM source); a budget the user
(or a layer) sets is left as given, and so is a method without drafting slots (rule ``spec.token_budget`` judges
both).
"""

from __future__ import annotations

from m3ctl.assess.context import PlanContext
from m3ctl.catalog import vllm_defaults


def spec_token_budget(ctx: PlanContext) -> tuple[int, str] | None:
    """(``--max-num-batched-tokens``, why) for the speculation ``ctx`` plans, or None: no speculation, a budget
    given, no slot table, a method without drafting slots, a depth whose tokens per step exceed max-model-len
    (vLLM's own bound of a budget, SchedulerConfig: max_num_seqs x max_model_len), or vLLM's default already fits
    every admitted sequence's draft tokens."""
    method, depth = ctx.speculation()
    table = vllm_defaults().draft_slots
    if depth <= 0 or table is None or ctx.explicit_int("max-num-batched-tokens") is not None:
        return None
    slots = table.slots(method, depth)
    if slots == 0:  # no drafting slots (EAGLE, MTP, n-gram): the verify tokens alone, judged by rule spec.token_budget
        return None
    block, _ = ctx.drafter_block()
    if method == "dspark" and block and depth != block:  # a depth off the drafter's block: rule spec.dspark_depth's
        return None
    mbt, seqs = ctx.scheduler_limits()
    per = 1 + depth + slots
    need = seqs * per
    mml = ctx.max_model_len()
    if need <= mbt or (mml and per > mml):  # past max-model-len a step per sequence is no budget: rule
        return None  # spec.token_budget judges the depth (vLLM warns over max_num_seqs x max_model_len too)
    return need, (
        f"{method} speculation at depth {depth}: each of max-num-seqs {seqs} decoding sequences takes 1 + {depth} "
        f"verify tokens + {slots} drafting slots a step ({need} in all); vLLM's default budget {mbt} would decode at "
        f"most {mbt // per} at once and warn (draft_slots of m3ctl/data/vllm_defaults.yaml: {table.source.split(';')[0]})"
    )
