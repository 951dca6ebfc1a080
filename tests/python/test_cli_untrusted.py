"""The CLI against what a model file or a failing engine hands it.

- `kvllm info` printed general.name (and the tokenizer's names) raw: a name carrying terminal escapes could
  retitle the window, move the cursor or clear the screen.  Control characters (C0, DEL, C1) are now printed
  as \\uXXXX escapes, in text and in --json (whose parse gives the name back exactly);
- `kvllm run` exited 0 after the engine ended the sequence with an error ("the sampler found no valid
  token": a model whose logits are all NaN): it now exits 1.
"""
from __future__ import annotations

import json

import numpy as np

from gen_model import ModelConfig, write_model
from kvtest import run_cli

SMALL = dict(n_vocab=256, n_embd=64, n_layer=1, n_head=4, n_head_kv=4, n_ff=128, n_ctx=256)


def test_info_escapes_control_characters(kvllm, tmp_path):
    name = "evil\x1b]0;pwned\x07\x1b[2J\x7f\u009b31m"
    path = write_model(tmp_path / "evil.gguf", ModelConfig(**SMALL, name=name), seed=1)
    out = run_cli(kvllm, "info", path).check_ok().out
    for c in ("\x1b", "\x07", "\x7f", "\u009b"):
        assert c not in out, (c, out)
    assert "evil\\u001b]0;pwned\\u0007\\u001b[2J\\u007f\\u009b31m" in out, out
    j = json.loads(run_cli(kvllm, "info", "--json", path).check_ok().out)
    assert j["name"] == name


def test_run_exits_1_when_the_engine_fails(kvllm, tmp_path):
    cfg = ModelConfig(**SMALL)
    nan = np.full((cfg.n_vocab, cfg.n_embd), np.nan, dtype=np.float32)
    path = write_model(tmp_path / "nan.gguf", cfg, seed=1, tensors={"output.weight": nan})
    res = run_cli(kvllm, "run", "-m", path, "-p", "a", "-n", "4")
    assert res.returncode == 1 and "no valid token" in res.err, res.describe()
