"""A step's forward recorded once per step shape and replayed (the default) against every op issued directly
(--enforce-eager): the same ops with the same arguments, so the outputs must be bit-identical.

Through `kvllm batch` (ids and every step's logits, f32 KV) on two random models from gen_model.py: a Gemma 3
with sliding-window and global layers (its own window pool and tables, soft-caps, q/k norms, GeGLU) and a Qwen3
MoE (routing and experts), in modes that make the step shapes vary: mixed prefill chunks and decodes with prefix
hits, n = 2 samples with temperature (forks, copy-on-write, host sampling), a pool so small that sequences are
preempted, and prompt-lookup speculation (several logits rows per sequence); through `kvllm eval` (a session:
a prefill chunk, then one token per call, the raw logits of every row); and through `kvllm serve` on
stories260K (completions, greedy and sampled).  The CLI runs on the backend KVLLM_BACKEND names (ctest runs this
file on the normal and the strict backend).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from gen_model import ModelConfig, write_model
from kvtest import run_batch as _run_batch
from kvtest import run_cli, shared_prefix_prompts
from server_util import Server, ok, stories_args

N_VOCAB = 300
MAX_TOKENS = 24
run_batch = functools.partial(_run_batch, n_vocab=N_VOCAB, max_tokens=MAX_TOKENS)
COMMON = ["--block-size", "4", "--max-batch-tokens", "48", "-t", "2"]


def gemma3() -> ModelConfig:
    return ModelConfig(arch="gemma3", n_vocab=N_VOCAB, n_embd=64, n_layer=4, n_head=4, n_head_kv=2, key_length=16,
                       n_ff=128, n_swa=12, rope_theta=1e6, norm_eps=1e-6, tied=True, n_ctx=512)


def qwen3moe() -> ModelConfig:
    return ModelConfig(arch="qwen3moe", n_vocab=N_VOCAB, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                       key_length=16, n_ff=96, n_expert=4, n_expert_used=2, n_ctx=512)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("graph")
    models = {"gemma3": write_model(d / "gemma3.gguf", gemma3(), seed=31),
              "moe": write_model(d / "moe.gguf", qwen3moe(), seed=32)}
    prompts = shared_prefix_prompts(np.random.default_rng(7), 10, N_VOCAB, n_shared=30, head_min=4, phrase_max=4)
    return d, models, prompts


MODES = {
    "mixed": [],
    "sampled_n2": ["--temp", "1.0", "--seed", "3", "--n", "2"],
    "preempt": ["--kv-tokens", "128", "--max-batch-tokens", "16"],
    "ngram": ["--spec-ngram", "--spec-tokens", "3"],
}


# every mode on the windowed model; the MoE model's routing in the mixed mode alone (the other modes repeat the
# step paths Gemma 3 already crosses)
CASES = [("gemma3", m) for m in MODES] + [("moe", "mixed")]


@pytest.mark.parametrize("model,mode", CASES, ids=[f"{m}-{mode}" for m, mode in CASES])
def test_batch_replay_equals_eager(kvllm, setup, model, mode):
    d, models, prompts = setup
    ref_ids, ref_lg, _ = run_batch(kvllm, d, models[model], prompts, f"eager_{model}_{mode}", *COMMON,
                                   *MODES[mode], "--enforce-eager")
    ids, lg, _ = run_batch(kvllm, d, models[model], prompts, f"graph_{model}_{mode}", *COMMON, *MODES[mode])
    assert ids == ref_ids
    assert np.array_equal(lg.view(np.uint32), ref_lg.view(np.uint32)), "replayed logits differ from eager ones"


def test_session_replay_equals_eager(kvllm, setup, tmp_path):
    """kvllm eval: a session's prefill chunk then one token per call; every row's logits, byte for byte."""
    _, models, prompts = setup
    toks = " ".join(map(str, prompts[0] + prompts[1]))
    out = {}
    for name, extra in (("eager", ["--enforce-eager"]), ("graph", [])):
        f = tmp_path / f"{name}.bin"
        r = run_cli(kvllm, "eval", "-m", models["gemma3"], "--tokens", toks, "--prefill", "9", "--batch", "8",
                    "-o", f, *extra)
        assert r.returncode == 0, r.describe()
        out[name] = f.read_bytes()
    assert len(out["graph"]) == (len(prompts[0]) + len(prompts[1])) * N_VOCAB * 4
    assert out["graph"] == out["eager"]


def test_server_replay_equals_eager(kvllm, stories):
    """kvllm serve on stories260K: the same completions, greedy and sampled with a seed, token for token."""
    bodies = [{"model": "stories260K", "prompt": p, "max_tokens": 32, "temperature": t, "seed": 5,
               "return_tokens_as_token_ids": True, "logprobs": 1}
              for p in ("Once upon a time", "The cat sat", "Lily and Ben went") for t in (0.0, 0.8)]
    got = {}
    for name, extra in (("eager", ["--enforce-eager"]), ("graph", [])):
        s = Server(kvllm, *stories_args(stories), *extra)
        try:
            got[name] = [ok(s, "/v1/completions", b)["choices"][0]["logprobs"] for b in bodies]
        finally:
            s.stop()
    assert got["graph"] == got["eager"]
    assert all(len(lp["tokens"]) == 32 for lp in got["graph"])
