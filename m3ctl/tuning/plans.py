"""The trial plans of a study: each candidate planned as its trial server runs it (m3ctl.planning.plan with the
study's base options and start measures), and what the search asks of a plan (GPUs, commands, the keys that tell
two configurations run one server, one engine at a load, or share a compile cache). :class:`TrialPlans` is the
planning half of :class:`m3ctl.tuning.server.ServerEvaluator`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from m3ctl.assess.request import PlanRequest
from m3ctl.core.state import Registry
from m3ctl.errors import ConfigRejected
from m3ctl.planning.finish import renamed
from m3ctl.planning.launchplan import find_vllm_executable
from m3ctl.planning.plan import plan
from m3ctl.serving.kernels import jit_measure_args
from m3ctl.tuning import startup
from m3ctl.tuning.options import TuneSpec
from m3ctl.tuning.space import FLAGS, Space, describe, key_of, plan_kwargs

#: The candidate key that names a plan's stack (``recipe``: the conservative recipe plan); not a search knob.
STACK = "stack"


def stack_kwargs(stack: str | None) -> dict[str, Any]:
    """The plan request's keywords for a candidate's ``stack``: the plan option ``stack`` (PlanRequest.stack:
    ``day0``, the default, or ``recipe``). Against a planner without that option, whose plan is the recipe's,
    nothing (the recipe point then plans the baseline's very server and is skipped as such)."""
    if stack is None or STACK not in PlanRequest.model_fields:
        return {}
    return {STACK: stack}


#: Smoke level of a trial server (m3ctl/serving/smoke.py): the workload checks only; parsers and output are the tuned
#: command's business once it is served with ``m3ctl serve``.
TRIAL_SMOKE = "quick"


class TrialPlans:
    """Launches one real server per configuration (m3ctl's serve + bench libraries).

    Args:
        plan_base: plan() keyword arguments shared by every candidate (profile, overrides, extra_args,
            skip_checks, variant, max_model_len, runtime...).
        bench: BenchConfig fields for the workload (workload, input_len, output_len, seed, ...).
        name_prefix: deployment names are ``{name_prefix}-t{trial}``; resume stops any leftover of that prefix.
    """

    def __init__(
        self,
        inventory,
        model: str,
        study_dir: Path,
        spec: TuneSpec,
        *,
        plan_base: dict[str, Any],
        bench: dict[str, Any],
        port: int,
        name_prefix: str,
        registry=None,
        space=None,
        fast_starts: bool = True,
    ):

        self.inv, self.model, self.dir, self.spec = inventory, model, Path(study_dir), spec
        self.plan_base, self.bench, self.port, self.prefix = plan_base, bench, port, name_prefix
        self.registry = registry or Registry()
        self.spec_method = space.spec_method if space is not None else None
        self.current: str | None = None
        self.trial_dir: Path | None = None
        self.suffix = ""  # start_suffix of the current start's records
        #: the plan (or the rejection) of each configuration, planned once (:meth:`_planned`): shared by the slot
        #: copies (ServerEvaluator.for_slot), whose port and pinned GPUs are part of the key
        self._plans: dict[tuple[str, int, tuple[int, ...]], Any] = {}
        #: the study's start measures (m3ctl.tuning.startup): one compile cache per study and model, CUDA-graph
        #: capture bounded by the ladder. Off: every trial starts as `m3ctl serve` would.
        self.fast_starts = fast_starts
        self.cache_root = startup.study_cache_root(self.dir, model)

    def share_plans(self, other: TrialPlans | None) -> None:
        """Plan with ``other``'s store of plans (:meth:`_planned`; shared from now on) where they are this study's:
        the same inventory, model, port, base options and speculation method (a new study's settings planned the
        whole space to collapse it: m3ctl.tuning.settings.new_study). Otherwise (or None) nothing changes."""
        facts = ("inv", "model", "port", "spec_method", "plan_base")
        if other is not None and all(getattr(other, f) == getattr(self, f) for f in facts):
            self._plans = other._plans

    def plan(self, cand: dict[str, Any], name: str | None = None):
        """``cand`` planned for this host with the study's base options: a new plan on every call (named ``name``,
        default ``{prefix}-check``). Raises ConfigRejected when a rule rejects it."""
        base = dict(self.plan_base)
        prof = base.pop("profile", None)
        # trials start here: this machine's vLLM, also for a catalog system's inventory (whose plan names none)
        base["vllm_executable"] = base.get("vllm_executable") or find_vllm_executable()
        req = PlanRequest(
            model=self.model,
            name=name or f"{self.prefix}-check",
            port=self.port,
            **base,
            **plan_kwargs(cand, self.spec_method),
            **stack_kwargs(cand.get(STACK)),
        )
        req.profile = prof
        return plan(self.inv, req)

    def _planned(self, cand: dict[str, Any], name: str | None = None):
        """:meth:`plan`, once per configuration: the first plan of ``cand`` (or its rejection, raised again) answers
        every question that does not depend on the deployment name (GPUs, keys, the start measures); under
        another ``name`` (a trial's, which enters the served names of its command line) it is that plan renamed
        (m3ctl.planning.finish.renamed: what a new plan under that name would be). Planning is a function of the
        inventory and the request, so a stored answer stays right for the study."""
        key = (key_of(cand), self.port, tuple(self.plan_base.get("gpus") or ()))
        got = self._plans.get(key)
        if isinstance(got, ConfigRejected):
            raise got
        if got is not None:
            return got if name is None or got.name == name else renamed(got, name)
        try:
            p = self.plan(cand, name=name)
        except ConfigRejected as e:
            self._plans.setdefault(key, e)
            raise
        self._plans.setdefault(key, p)
        return p

    def trial_plan(self, cand: dict[str, Any], trial: int | str):
        """The plan a trial server runs: named ``{prefix}-t{trial}``, plus the measurement-only flags.

        Measuring servers log every in-service kernel JIT compile (ServerSession.measure repeats spoiled runs);
        the flag is for measurement only: the tuned command and profile.yaml come from plan() without it."""
        p = self._planned(cand, name=f"{self.prefix}-t{trial}")
        extra = [a for a in jit_measure_args() if a not in p.argv]
        update: dict[str, Any] = {"argv": [*p.argv, *extra]} if extra else {}
        if self.fast_starts:
            update.update(self._start_measures(p, update.get("argv", p.argv)))
        return p.model_copy(update=update) if update else p

    def start_measures_note(self, cand: dict[str, Any]) -> str:
        """The start measures of ``cand``'s trial server in words (for ``--dry-run``)."""
        if not self.fast_starts:
            return "off (--no-fast-starts): every trial starts as `m3ctl serve` would"
        p = self._planned(cand)
        _, note = self._capture_bound(p, p.argv)
        inherited: dict[str, str] | None = {} if p.runtime == "docker" else None
        fork = startup.engine_process_env(p.env, inherited)
        engine = "engine-core process forked" if fork else "engine-core start method left to the environment"
        kc = startup.kernel_cache_env(self.cache_root, p.env, inherited)
        kernels = (
            f"one Inductor kernel cache across compile keys ({kc[startup.facts().kernel_cache.env]}, AOT compile off)"
            if kc
            else "Inductor's kernel cache left to the environment"
        )
        warm = "; a prewarmed server process per trial" if p.runtime == "process" else ""
        return f"compile cache {self.cache_root} (one per study and model); {kernels}; {note}; {engine}{warm}"

    def _capture_bound(self, p, argv: list[str]) -> tuple[list[str], str]:
        if not p.gpus:  # CPU: no CUDA graphs to bound
            return [], "no CUDA graphs on CPU"
        seqs = p.scheduler_limits[1] if p.scheduler_limits is not None else None
        return startup.capture_bound_args(argv, max(self.spec.ladder), p.spec_depth, seqs)

    def _start_measures(self, p, argv: list[str]) -> dict[str, Any]:
        """The trial plan's start measures (m3ctl.tuning.startup): the study's vLLM cache root in its environment
        (bind-mounted at the same path for the docker runtime) and the CUDA-graph capture bound of the ladder.
        Measurement-only, like the JIT-monitor flag: the tuned command and profile.yaml come from plan()."""
        flags, _ = self._capture_bound(p, argv)
        inherited: dict[str, str] | None = {} if p.runtime == "docker" else None
        env = {**p.env, **startup.cache_env(self.cache_root)}
        env.update(startup.kernel_cache_env(self.cache_root, env, inherited))
        env.update(startup.engine_process_env(env, inherited))
        out: dict[str, Any] = {"argv": [*argv, *flags], "env": env}
        if p.runtime == "docker":
            out["mounts"] = [*p.mounts, f"{self.cache_root}:{self.cache_root}:rw"]
        return out

    def check(self, cand: dict[str, Any]):
        return self._planned(cand)

    def server_key(self, cand: dict[str, Any]) -> str:
        """What the server of ``cand`` would effectively run, as a comparable string: its vLLM arguments with
        the scheduler limits resolved (an explicit ``--max-num-seqs 1024`` equals vLLM's default of 1024 on an
        H200; :attr:`m3ctl.planning.plan.LaunchPlan.scheduler_limits`), its environment and layout. Two candidates with
        the same key start the same engine. Raises ConfigRejected like :meth:`check`."""
        return json.dumps(self._key(self._planned(cand)), sort_keys=True, default=str)

    def load_key(self, cand: dict[str, Any], max_concurrency: int) -> str:
        """:meth:`server_key` as a load of at most ``max_concurrency`` requests in flight sees it: a resolved
        max-num-seqs of at least ``max_concurrency`` never admits fewer requests than arrive, so it reads as
        ``">=C"``; the largest CUDA graph the load can replay (the trial's capture bound, or vLLM's default
        ``min(2 x max-num-seqs, 512)``, cut at ``max_concurrency x (1 + speculative tokens)``) is part of the key,
        since max-num-seqs also sets that default. Two candidates with the same load key run the same engine for
        that load: the difference between their measurements is the spread between fresh servers
        (m3ctl.tuning.choice.fresh_server_spread). Raises ConfigRejected like :meth:`check`."""
        p = self._planned(cand)
        key = self._key(p)
        seqs = p.scheduler_limits[1] if p.scheduler_limits is not None else None
        if seqs is not None and int(seqs) >= max_concurrency:
            key["args"]["max-num-seqs"] = f">={max_concurrency}"
        if p.gpus:
            flags, _ = self._capture_bound(p, p.argv)
            top = (
                startup.capture_bound(max(self.spec.ladder), p.spec_depth)
                if flags
                else startup.default_capture_max(seqs)
            )
            key["graphs_up_to"] = min(top, startup.capture_bound(max_concurrency, p.spec_depth))
        return json.dumps(key, sort_keys=True, default=str)

    def layout(self, cand: dict[str, Any]) -> dict[str, int] | None:
        """The parallel layout the server of ``cand`` runs, ``{tp, pp, dp}`` of its plan (the planner may raise
        PP so the weights fit); None for a candidate the planner rejects."""
        try:
            p = self._planned(cand)
        except ConfigRejected:
            return None
        return {"tp": p.tp, "pp": p.pp, "dp": p.dp}

    def describe(self, cand: dict[str, Any], space: Space | None = None) -> str:
        """:func:`m3ctl.tuning.space.describe` of ``cand`` with its planned :meth:`layout`: the text a trial, the
        dry run, the report and the profile show."""
        return describe(cand, space, self.layout(cand))

    @staticmethod
    def _key(p) -> dict[str, Any]:
        args = {k: v for k, v in (p.vllm_args or {}).items() if k not in ("max-num-batched-tokens", "max-num-seqs")}
        if p.scheduler_limits is not None:
            args["max-num-batched-tokens"], args["max-num-seqs"] = p.scheduler_limits
        return {
            "args": args,
            "env": p.env,
            "tp": p.tp,
            "dp": p.dp,
            "dcp": p.dcp,
            "ep": p.ep,
            "dbo": p.dbo,
            "gpus": len(p.gpus),
        }

    @staticmethod
    def n_gpus_plan(p) -> int:
        """GPUs a plan's server occupies, its world size TP x PP x DP (1 for a CPU plan): the per-GPU divisor."""
        return max(1, p.tp * p.pp * p.dp) if p.gpus else 1

    def n_gpus(self, cand: dict[str, Any]) -> int:
        """GPUs the server of ``cand`` occupies (:meth:`gpus_needed`: the planner may add pipeline parallelism
        to fit a TP); TP x DP for a candidate the planner rejects (it is never measured)."""

        if not self.inv.gpus:
            return 1
        try:
            return self.gpus_needed(cand)
        except ConfigRejected:
            return max(1, cand.get("tp", 1) * cand.get("dp", 1))

    def command(self, cand: dict[str, Any]) -> str:
        return self.plan(cand, name=self.plan_base.get("served_model_name") or "m3ctl").command_line()

    def baseline_candidate(self) -> tuple[dict[str, Any] | None, str]:
        """vLLM's defaults as a candidate: none of the tuned knobs' flags (vLLM picks max-num-seqs,
        max-num-batched-tokens... itself; no speculation), DP 1 and the smallest power-of-two TP that the
        planner accepts (1 first). Returns (candidate, "") or (None, why: the last rejection)."""

        why = "no GPU count to try"
        tp, n = 1, max(1, len(self.inv.gpus))
        while tp <= n:
            cand = {"tp": tp, "dp": 1}
            try:
                self._planned(cand, name=f"{self.prefix}-tbase")  # the baseline's trial plan (trial_plan reuses it)
                return cand, ""
            except ConfigRejected as e:
                why = f"TP {tp}: {e.message}"
            tp *= 2
        return None, f"the planner rejects vLLM's defaults at every TP ({why})"

    def recipe_candidate(self) -> tuple[dict[str, Any] | None, str]:
        """The recipe stack at vLLM's defaults: the baseline's candidate planned with ``stack: recipe`` (the
        conservative recipe plan, no day-0 part turned on by default). Returns (candidate, "") or (None, why)."""
        base, why = self.baseline_candidate()
        if base is None:
            return None, f"no vLLM-defaults configuration to plan the recipe stack at ({why})"
        cand = {**base, STACK: "recipe"}
        try:
            self._planned(cand, name=f"{self.prefix}-trecipe")
        except ConfigRejected as e:
            return None, f"the planner rejects the recipe stack: {e.message}"
        return cand, ""

    def gpus_needed(self, cand: dict[str, Any]) -> int:
        """GPUs the server of ``cand`` occupies on this host: the plan's world size (TP x PP x DP), at least 1
        (a CPU plan: 1). Raises ConfigRejected like :meth:`check`."""
        return self.n_gpus_plan(self._planned(cand))  # bisection and confirmation ask at every level

    def compile_key(self, cand: dict[str, Any]) -> str:
        """Which torch.compile cache entry the server of ``cand`` would use, as a comparable string: two candidates
        with the same key compile the same graph, so the second one started after the first finds it compiled
        (vLLM keys its compilation cache on ``VllmConfig.compute_hash()``: https://docs.vllm.ai/en/latest/design/
        torch_compile.html). Used to order parallel trials (m3ctl/tuning/schedule.py); raises ConfigRejected like
        :meth:`check`.

        The key is the plan's model, image, layout (TP/PP/DP/DCP/EP/DBO), environment and vLLM flags, minus what
        does not enter vLLM's hash: where the server listens and what it is called (port, host and served name are
        not among :attr:`~m3ctl.planning.plan.LaunchPlan.vllm_args`), the visible-device and port variables
        (:data:`COMPILE_NEUTRAL_ENV`: the cache is keyed by rank, not by GPU), and ``--max-num-seqs`` when the CUDA
        graph capture sizes are pinned (``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size`` in
        ``--compilation-config``, or the flags of the same names) or with ``--enforce-eager`` (no graph at all).
        ``SchedulerConfig.compute_hash`` has no factors, but the scheduler limits reach the hash through the
        compilation config: max-num-seqs sets the default largest capture size (``min(max_num_seqs x 2, 512)``,
        ``_set_cudagraph_sizes``) and max-num-batched-tokens is the end of the compile ranges
        (``_set_compile_ranges``), so ``--max-num-batched-tokens`` stays in the key unless the server is eager
        (https://github.com/vllm-project/vllm/blob/main/vllm/config/vllm.py, vllm/config/scheduler.py,
        vllm/config/compilation.py).
        """
        p = self._planned(cand)
        args = dict(p.vllm_args or {})
        eager = bool(args.get("enforce-eager"))
        bounded = self.fast_starts and bool(self._capture_bound(p, p.argv)[0])  # the trial's own capture bound
        if eager or bounded or _capture_sizes_pinned(args):
            args.pop("max-num-seqs", None)
        if eager:
            args.pop("max-num-batched-tokens", None)
        env = {k: v for k, v in p.env.items() if k not in COMPILE_NEUTRAL_ENV}
        return json.dumps(
            {
                "model": p.model,
                "image": p.image,
                "args": args,
                "env": env,
                "tp": p.tp,
                "pp": p.pp,
                "dp": p.dp,
                "dcp": p.dcp,
                "ep": p.ep,
                "dbo": p.dbo,
            },
            sort_keys=True,
            default=str,
        )


def collapse_same_servers(plans: TrialPlans, space: Space) -> tuple[Space, list[str]]:
    """``space`` without the knob values that only plan servers another value of the same knob plans already
    (pruning before launch, as :func:`m3ctl.tuning.space.prune_dominated`): a value ``b`` of a knob goes when
    every configuration with ``b`` that the rules accept has the :meth:`TrialPlans.server_key` of the same configuration
    with an earlier kept value ``a`` (e.g. ``kv_cache_dtype`` default and nvfp4 where the checkpoint's KV cache
    is NVFP4: one ``vllm serve`` command but for each trial's port, served name and caches). Measuring both
    would spend two starts of the budget on one server. Returns the space and one note per dropped value."""
    keys: dict[str, str | None] = {}

    def key(c: dict[str, Any]) -> str | None:
        k = key_of(c)
        if k not in keys:
            try:
                keys[k] = plans.server_key(c)
            except ConfigRejected:
                keys[k] = None
        return keys[k]

    vals = {k: list(v) for k, v in space.values.items()}
    notes: list[str] = []
    for knob in list(vals):
        kept: list[Any] = []
        for b in vals[knob]:
            rest = Space({**vals, knob: [b]}).grid()
            same = next((a for a in kept if _same_servers(key, rest, knob, a)), _NONE)
            if same is _NONE:
                kept.append(b)
                continue
            flag = FLAGS.get(knob, knob)
            shown = next((plans.check(c).vllm_args.get(flag) for c in rest if key(c) is not None), None)
            notes.append(
                f"{knob} {b} dropped: it plans the very server of {knob} {same}"
                + (f" (--{flag} {shown} in both)" if shown is not None else "")
                + ": the same vllm serve command but for each trial's port, name and caches, so it would "
                "measure one server twice"
            )
        vals[knob] = kept
    return Space(values=vals, spec_method=space.spec_method, pinned_by_user=set(space.pinned_by_user)), notes


_NONE = object()


def _same_servers(key, cands: list[dict[str, Any]], knob: str, other: Any) -> bool:
    """Every candidate of ``cands`` that the rules accept (``key`` not None; at least one) has the server key of the
    same candidate with ``knob`` set to ``other``."""
    accepted = [c for c in cands if key(c) is not None]
    return bool(accepted) and all(key(c) == key({**c, knob: other}) for c in accepted)


#: Server environment that does not change the compiled graph: which GPUs, the device order, internal ports.
COMPILE_NEUTRAL_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "VLLM_PORT",
        "MASTER_PORT",
    }
)


def _capture_sizes_pinned(args: dict[str, Any]) -> bool:
    """True when the vLLM flags fix the CUDA graph capture sizes (so max-num-seqs does not choose them)."""
    names = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")
    if any(k.replace("-", "_") in names for k in args):
        return True
    if any(k.replace("-", "_").startswith("compilation_config.") and k.split(".", 1)[1] in names for k in args):
        return True
    cc = args.get("compilation-config", args.get("compilation_config"))
    if isinstance(cc, str):
        try:
            cc = json.loads(cc)
        except ValueError:
            return False
    return isinstance(cc, dict) and any(cc.get(n) is not None for n in names)
