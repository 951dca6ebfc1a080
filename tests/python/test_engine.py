"""The engine seen through `kvllm batch`: batch invariance, preemption, prefix caching, chunked
prefill, n > 1 samples with copy-on-write, and no KV block left held afterwards.

Every prompt is run alone and then together with the others under many engine settings; greedy
ids must be identical and logits bit-identical (f32 KV), since every kernel reduces a row in an
order fixed by that row alone.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from gen_model import ModelConfig, write_model
from kvtest import run_batch as _run_batch
from kvtest import run_cli

MAX_TOKENS = 40
run_batch = functools.partial(_run_batch, n_vocab=320, max_tokens=MAX_TOKENS)
N_PROMPTS = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine")
    cfg = ModelConfig(n_vocab=320, n_embd=64, n_layer=2, n_head=8, n_head_kv=2, n_ff=160, n_ctx=512)
    model = write_model(d / "gqa.gguf", cfg, seed=11)
    rng = np.random.default_rng(3)
    shared_prefix = [1] + rng.integers(3, cfg.n_vocab, size=40).tolist()
    prompts = []
    for i in range(N_PROMPTS):
        n = int(rng.integers(3, 70))
        tail = rng.integers(3, cfg.n_vocab, size=n).tolist()
        # half the prompts share a 41-token prefix (2 full blocks of 16 and a partial one)
        prompts.append(shared_prefix + tail if i % 2 else [1] + tail)
    return d, model, cfg, prompts


@pytest.fixture(scope="module")
def alone(kvllm, setup):
    d, model, _, prompts = setup
    out = [run_batch(kvllm, d, model, [p], f"alone{i}") for i, p in enumerate(prompts)]
    return [o[0][0] for o in out], np.stack([o[1][0] for o in out])


SETTINGS = {
    "default": [],
    "no_prefix_cache": ["--no-prefix-cache"],
    "chunk_1": ["--max-batch-tokens", "1"],
    "chunk_7": ["--max-batch-tokens", "7"],
    "chunk_64": ["--max-batch-tokens", "64"],
    "block_size_5": ["--block-size", "5"],
    "max_seqs_3": ["--max-seqs", "3"],
    # a pool of 160 positions cannot hold all eight sequences: preemption and recompute
    "preempt": ["--kv-tokens", "160"],
    "preempt_no_prefix": ["--kv-tokens", "160", "--no-prefix-cache"],
    "preempt_chunk_7": ["--kv-tokens", "160", "--max-batch-tokens", "7"],
    "threads_1": ["-t", "1"],
    # asynchronous scheduling (each step planned while the previous one runs): the same tokens and
    # logits, also when it admits, chunks and preempts a step later than the synchronous order
    "async": ["--async-scheduling"],
    "async_chunk_7": ["--async-scheduling", "--max-batch-tokens", "7"],
    "async_max_seqs_3": ["--async-scheduling", "--max-seqs", "3"],
    "async_preempt": ["--async-scheduling", "--kv-tokens", "160"],
    "async_preempt_chunk_7": ["--async-scheduling", "--kv-tokens", "160", "--max-batch-tokens", "7"],
}


@pytest.mark.parametrize("name", SETTINGS)
def test_batch_invariance(kvllm, setup, alone, name):
    d, model, _, prompts = setup
    ids, logits, stats = run_batch(kvllm, d, model, prompts, f"all_{name}", *SETTINGS[name])
    want_ids, want_logits = alone
    assert (stats["planned_ahead"] > 0) == name.startswith("async"), stats
    assert ids == want_ids, f"{name}: greedy ids differ from the prompts run alone"
    diff = np.abs(logits - want_logits).max() / np.abs(want_logits).max()
    assert diff <= 1e-6, f"{name}: max|batched - alone| / max|alone| = {diff:.3g}"
    if name.startswith("preempt"):
        assert stats["preemptions"] > 0, "the small pool should have forced preemptions"
    if name in ("max_seqs_3", "chunk_7", "async_max_seqs_3", "async_chunk_7"):
        # admitted after others computed the shared 41-token prefix: its full blocks are reused
        # (with everything admitted in the first step there is nothing cached yet to hit)
        assert stats["cached"] > 0, "prompts sharing a 41-token prefix should hit the prefix cache"
    if "no_prefix" in name:
        assert stats["cached"] == 0


def test_n_samples_share_prompt(kvllm, setup, alone):
    """n = 4 greedy samples of each prompt: forked off the prompt's blocks (copy-on-write of the
    shared partial block), each identical to the prompt run alone."""
    d, model, _, prompts = setup
    ids, logits, stats = run_batch(kvllm, d, model, prompts[:3], "n4", "--n", "4")
    want_ids, want_logits = alone
    for r in range(3):
        for k in range(4):
            assert ids[r * 4 + k] == want_ids[r]
            assert np.array_equal(logits[r * 4 + k], want_logits[r])


def test_sampled_n_reproducible(kvllm, setup):
    """Sampling with a seed: the same batch twice gives the same ids; the samples differ."""
    d, model, _, prompts = setup
    a = run_batch(kvllm, d, model, prompts[:2], "temp_a", "--n", "3", "--temp", "1.0", "--seed", "5")[0]
    b = run_batch(kvllm, d, model, prompts[:2], "temp_b", "--n", "3", "--temp", "1.0", "--seed", "5")[0]
    assert a == b
    assert len({tuple(x) for x in a[:3]}) > 1, "three samples at temperature 1 should not all agree"


def test_never_fits_rejected(kvllm, setup):
    d, model, _, prompts = setup
    pf = d / "big.txt"
    pf.write_text(" ".join(map(str, prompts[1])) + "\n")
    res = run_cli(kvllm, "batch", "-m", model, "--prompts", pf, "--max-tokens", "100", "--kv-tokens", "64")
    assert res.returncode == 1, res.describe()
    assert "never fit" in res.err and "blocks" in res.err, res.describe()


@pytest.mark.parametrize("order", ["sync", "async"])
def test_batch_under_asan(asan_bin, setup, alone, order):
    d, model, _, prompts = setup
    extra = ["--async-scheduling"] if order == "async" else []
    ids, _, stats = run_batch(asan_bin, d, model, prompts, f"asan_{order}", "--kv-tokens", "160", "--max-batch-tokens",
                              "7", *extra)
    assert ids == alone[0] and stats["preemptions"] > 0
    assert (stats["planned_ahead"] > 0) == (order == "async")


def test_bench_throughput_waste(kvllm, setup):
    """bench throughput's statistics: KV waste only in each sequence's last block (within 0.5
    percentage points of the ideal), also under preemption; continuous keeps bigger batches."""
    import json
    d, model, _, _ = setup
    rows = {}
    for name, extra in {"roomy": [], "tight": ["--kv-tokens", "320"], "static": ["--static"]}.items():
        res = run_cli(kvllm, "bench", "throughput", "-m", model, "--requests", "24", "--prompt-len", "20:90",
                      "--gen-len", "8:40", "--max-seqs", "8", "-o", "json", *extra)
        assert res.returncode == 0, res.describe()
        rows[name] = json.loads(res.out)
    for name, r in rows.items():
        for key in ("requests_per_s", "tokens_per_s", "mean_batch", "kv_utilization_pct", "kv_waste_pct",
                    "prefix_hit_pct", "preemptions"):
            assert key in r, f"{name}: {key} missing"
        assert abs(r["kv_waste_pct"] - r["kv_waste_ideal_pct"]) <= 0.5, (name, r)
        assert r["kv_waste_pct"] < 25, (name, r)   # block 16 against sequences of 28..130 tokens
    assert rows["tight"]["preemptions"] > 0 and rows["roomy"]["preemptions"] == 0
    assert rows["roomy"]["mean_batch"] > rows["static"]["mean_batch"]
