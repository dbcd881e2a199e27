"""The scale model's tokenizer covers the config's whole vocabulary (docs/results/h100-spread.md): every id a
random-weight model can sample decodes to text, and encoding is what the trained tokenizer gives."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer

from m3ctl.dev.scale_model import ScaleModelSpec, build_scale_model
from m3ctl.dev.tiny_model import build_tokenizer, pad_vocabulary
from m3ctl.errors import BadInput


@pytest.mark.parametrize("arch", ["minimax-m2", "minimax-m3"])
def test_every_id_of_the_head_decodes(tmp_path, arch):
    out = build_scale_model(tmp_path / arch, ScaleModelSpec(arch=arch, layers=1))
    cfg = json.loads((out / "config.json").read_text())
    vocab_size = cfg.get("vocab_size") or cfg["text_config"]["vocab_size"]
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.get_vocab_size() == vocab_size == 200064
    assert sorted(tok.get_vocab().values()) == list(range(vocab_size))  # no hole: id -> one token
    rng = random.Random(7)
    ids = [rng.randrange(2048, vocab_size) for _ in range(200)]
    text = tok.decode(ids)
    assert len(text.split()) == len(ids) and "\ufffd" not in text  # each id one word, valid UTF-8


def test_padding_leaves_encoding_alone_and_is_idempotent(tmp_path):
    build_tokenizer(tmp_path, 2048)
    before = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    sample = "def f(x):\n    return x * 2  # doubled\n"
    assert pad_vocabulary(tmp_path, 5000) == 5000 - 2048
    after = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert after.encode(sample).ids == before.encode(sample).ids
    assert after.get_vocab_size() == 5000
    assert pad_vocabulary(tmp_path, 5000) == 0 and pad_vocabulary(tmp_path, 100) == 0


def test_a_vocabulary_too_large_to_pad_is_refused(tmp_path):
    build_tokenizer(tmp_path, 2048)
    with pytest.raises(BadInput, match="too large"):
        pad_vocabulary(tmp_path, 2048 + 26**4 + 1)
