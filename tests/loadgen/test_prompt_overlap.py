"""The measured phase's prompts are built off the critical path: in a worker thread while the warm-ups run
(m3ctl.loadgen.prepare.overlaps), the measured window starting only once they all exist; and built in batches
(m3ctl.loadgen.prompts.exact_prompts) that give the texts one-at-a-time building gives.

No timing: the order of events, forced by making the build wait for the warm-ups' end."""

from __future__ import annotations

import random
import threading

import httpx
import pytest

from m3ctl.loadgen import drive, prepare, prompts, workloads
from m3ctl.loadgen.prompts import LocalTokenizer, ServerTokenizer, exact_prompt, exact_prompts
from m3ctl.loadgen.runner import BenchConfig, BenchServerDown, run_bench
from tests.conftest import groundtruth_pool


@pytest.fixture(scope="module")
def url(tiny_models):
    with groundtruth_pool("--ttft-ms", "2", "--itl-ms", "1", "--tokenizer", str(tiny_models["m2"])) as start:
        yield start()


def _cfg(url: str, **kw) -> BenchConfig:
    base = {"url": url, "model": "groundtruth", "input_len": 100, "output_len": 8, "num_prompts": 12}
    return BenchConfig(**{**base, "concurrency": 3, **kw})


@pytest.fixture
def events(monkeypatch) -> list[str]:
    """The run's events in order; the measured job's build waits (in its thread) until the warm-ups are over."""
    log: list[str] = []
    warmed = threading.Event()
    warm_up, measure, build_job = drive._warm_up, drive._measure, prepare.build_job

    async def warm(*a, **kw):
        log.append("warm-ups begin")
        try:
            return await warm_up(*a, **kw)
        finally:
            log.append("warm-ups end")
            warmed.set()

    async def measured(*a, **kw):
        log.append("measured window")
        return await measure(*a, **kw)

    def build(cfg, tok, salt=None, block=None):
        if salt is not None and salt.endswith("-warmup"):
            return build_job(cfg, tok, salt, block)
        log.append(f"build begins in {threading.current_thread().name.split('_')[0]}")
        if prepare.overlaps(cfg, tok):
            log.append("warm-ups over" if warmed.wait(60) else "warm-ups never ran during the build")
        out = build_job(cfg, tok, salt, block)
        log.append("built")
        return out

    monkeypatch.setattr(drive, "_warm_up", warm)
    monkeypatch.setattr(drive, "_measure", measured)
    monkeypatch.setattr(prepare, "build_job", build)
    return log


def test_the_measured_prompts_are_built_while_the_warm_ups_run(url, events, tiny_models):
    res = run_bench(_cfg(url, num_warmups=3, tokenizer=str(tiny_models["m2"])))
    begun = "build begins in m3ctl-prompts"  # a worker thread, started before the warm-ups
    assert [e for e in events if e != begun] == [
        "warm-ups begin",
        "warm-ups end",
        "warm-ups over",
        "built",
        "measured window",
    ]
    assert events.index(begun) < events.index("built"), events
    assert res["completed"] == 12 and res["total_input_tokens"] == 12 * 100  # every prompt of its exact length
    ph = res["run_phases_s"]
    assert ph["prompts"]["during_warmup"] is True and ph["prompts"]["build"] > 0
    assert res["validity"]["valid"], res["validity"]


@pytest.mark.parametrize(
    "kw, local",
    [({}, True), ({"num_warmups": 2, "client_procs": 2}, True), ({"num_warmups": 2}, False)],
    ids=["no warm-ups", "two processes", "the server's /tokenize"],
)
def test_otherwise_the_prompts_are_built_before_the_warm_ups(url, events, kw, local, tiny_models):
    """No warm-ups to overlap, warm-ups sent by forked processes (which take the job with them), or a tokenizer
    that would load the server under test during its warm-up."""
    res = run_bench(_cfg(url, **kw, **({"tokenizer": str(tiny_models["m2"])} if local else {})))
    assert events[0].startswith("build begins") and "m3ctl-prompts" not in events[0]
    assert events[1] == "built", events
    assert res["completed"] == 12 and res["total_input_tokens"] == 12 * 100
    assert res["run_phases_s"]["prompts"]["during_warmup"] is False and res["run_phases_s"]["prompts"]["waited"] == 0


def test_a_server_lost_while_the_measured_prompts_are_built_is_bench_server_down(url, monkeypatch, tiny_models):
    """The build in the worker thread fails as the server goes away: the same error as a loss before the warm-ups."""
    build_job = prepare.build_job

    def build(cfg, tok, salt=None, block=None):
        if salt is not None and salt.endswith("-warmup"):
            return build_job(cfg, tok, salt, block)
        assert threading.current_thread().name.startswith("m3ctl-prompts")
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(prepare, "build_job", build)
    with pytest.raises(BenchServerDown) as e:
        run_bench(_cfg(url, num_warmups=2, tokenizer=str(tiny_models["m2"])))
    assert "lost the server while bench prepared the prompts (nothing was measured)" in e.value.message
    assert e.value.exit_code == 4


class _Merging:
    """A word tokenizer with one merge ("time person" is one token) and batch calls: a draw of n words can give
    fewer than n tokens, and a cut can re-encode to another count, so batches fall back to one-at-a-time."""

    def __init__(self):
        self.vocab = {w: i for i, w in enumerate(prompts._WORDS)}
        self.words = {i: w for w, i in self.vocab.items()}
        self.merged = len(self.vocab)
        self.batches = 0

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for w in text.split():
            if ids and ids[-1] == self.vocab["time"] and w == "person":
                ids[-1] = self.merged
            else:
                ids.append(self.vocab[w])
        return ids

    def decode(self, ids: list[int]) -> str:
        return " ".join("time person" if i == self.merged else self.words[i] for i in ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self.batches += 1
        return [self.encode(t) for t in texts]

    def decode_batch(self, ids: list[list[int]]) -> list[str]:
        return [self.decode(i) for i in ids]


@pytest.mark.parametrize("kind", ["merging words", "tokenizer.json", "server /tokenize"])
def test_batched_prompts_are_the_one_at_a_time_prompts(kind, tiny_models, url):
    if kind == "server /tokenize":
        tok = ServerTokenizer(url, "groundtruth")
        assert tok.available() and tok.can_decode
    else:
        tok = _Merging() if kind == "merging words" else LocalTokenizer(tiny_models["m2"])
    lengths = random.Random(5).choices(range(1, 400), k=3 * prompts.BATCH + 5)
    a, b = random.Random(9), random.Random(9)
    one = [exact_prompt(tok, n, a) for n in lengths]
    assert exact_prompts(tok, lengths, b) == one and a.getstate() == b.getstate()
    assert [got for _, got in one] == lengths
    reqs = workloads.random_workload(tok, 40, 200, 8, 0.5, "vllm", 3, "aaaa1111")
    assert all(len(tok.encode(r.prompt)) == r.prompt_len for r in reqs)
