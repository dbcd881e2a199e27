from __future__ import annotations

import random

import pytest

from m3ctl.errors import BadInput
from m3ctl.loadgen.prompts import LocalTokenizer, exact_prompt, random_lengths


def test_exact_lengths_local_tokenizer(tiny_models):
    tok = LocalTokenizer(tiny_models["m2"])
    rng = random.Random(0)
    for n in (1, 2, 7, 64, 128, 511, 1000):
        text, got = exact_prompt(tok, n, rng)
        assert got == n and len(tok.encode(text)) == n


def test_seeded_reproducible(tiny_models):
    tok = LocalTokenizer(tiny_models["m2"])
    a = [exact_prompt(tok, 50, random.Random(3))[0] for _ in range(2)]
    assert a[0] == a[1]


def test_range_conventions():
    rng = random.Random(0)
    v = random_lengths(100, 0.5, 2000, rng, "vllm")
    assert min(v) >= 50 and max(v) <= 150 and min(v) < 60 and max(v) > 140
    x = random_lengths(100, 0.8, 2000, rng, "inferencex")
    assert min(x) >= 80 and max(x) <= 100 and min(x) < 83
    assert random_lengths(100, 0, 5, rng) == [100] * 5
    with pytest.raises(BadInput, match="outside \\[0, 1\\)"):
        random_lengths(100, 1.0, 1, rng, "vllm")
    with pytest.raises(BadInput, match="unknown range convention"):
        random_lengths(100, 0.5, 1, rng, "nope")
