"""A KV cache shaped per layer, through `kvllm batch`: a model with sliding-window and global layers keeps
only the window of its sliding layers, and nothing but the memory changes.

The model is a random Gemma 3 (gen_model.py): 7 layers, 6 sliding over 12 positions and 1 global, blocks of
4 positions, so a window spans 3-4 blocks and sequences of up to ~100 positions cross it 8 times.  The
reference is the same binary with --kv-full (every layer keeps whole contexts, as for a model without
windows): the same positions are read, so the ids and the logits must be bit-identical (f32 KV) with prefix
caching (prompts share prefixes), without it, with n = 2 samples (forks, copy-on-write), in a pool so small
that sequences are preempted and their prefix hits cut back, and with speculative decoding (prompt lookup
and a draft model, itself windowed, whose shadows roll back).  No block of either pool is held at the end.

Memory: one sequence of 400 positions decodes through a sliding pool of 9 blocks (36 positions: the plan's
1 x (ceil(11 / 4) + 2) + a step of 16 tokens, 4 blocks) with no preemption, so the window never took more,
while the global pool holds the 100 blocks of the whole context.
"""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from gen_model import ModelConfig, write_model
from kvtest import run_batch as _run_batch
from kvtest import run_cli, shared_prefix_prompts

import json
N_VOCAB = 300
WINDOW = 12
MAX_TOKENS = 60
run_batch = functools.partial(_run_batch, n_vocab=N_VOCAB, max_tokens=MAX_TOKENS)
COMMON = ["--block-size", "4", "--max-batch-tokens", "64"]   # prompts admitted over several steps: prefix hits


def gemma3(n_layer: int, n_embd: int, n_ff: int) -> ModelConfig:
    return ModelConfig(arch="gemma3", n_vocab=N_VOCAB, n_embd=n_embd, n_layer=n_layer, n_head=4, n_head_kv=2,
                       key_length=16, n_ff=n_ff, n_swa=WINDOW, rope_theta=1e6, norm_eps=1e-6, tied=True,
                       n_ctx=1024)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvwin")
    target = write_model(d / "target.gguf", gemma3(7, 64, 128), seed=21)
    draft = write_model(d / "draft.gguf", gemma3(2, 32, 64), seed=22)
    prompts = shared_prefix_prompts(np.random.default_rng(5), 16, N_VOCAB, n_shared=40, head_min=8, phrase_max=5)
    return d, target, draft, prompts


MODES = {
    "prefix": [],
    "no_prefix": ["--no-prefix-cache"],
    "sampled_n2": ["--temp", "1.0", "--seed", "3", "--n", "2"],
    "preempt": ["--kv-tokens", "160", "--max-batch-tokens", "16"],
    "ngram": ["--spec-ngram", "--spec-tokens", "4"],
    "ngram_preempt": ["--spec-ngram", "--kv-tokens", "160", "--max-batch-tokens", "16"],
    "draft": ["--draft-model", "{draft}", "--spec-tokens", "4"],
    "draft_self": ["--draft-model", "{target}", "--spec-tokens", "3"],
}


@pytest.mark.parametrize("mode", list(MODES))
def test_window_equals_full_cache(kvllm, setup, mode):
    d, target, draft, prompts = setup
    extra = [a.format(draft=draft, target=target) for a in MODES[mode]]
    ref_ids, ref_lg, ref_st = run_batch(kvllm, d, target, prompts, f"full_{mode}", *COMMON, *extra, "--kv-full")
    ids, lg, st = run_batch(kvllm, d, target, prompts, f"win_{mode}", *COMMON, *extra)
    assert ids == ref_ids
    assert np.array_equal(lg, ref_lg), "the logits differ from the full cache's"
    assert all(len(i) == MAX_TOKENS for i in ids)
    if mode != "no_prefix":
        assert st["cached"] > 0, st
    if "preempt" in mode:
        assert st["preemptions"] > 0, st
    if st["spec"]:
        assert st["spec"]["drafted"] > 0
    assert st["win_blocks"] > 0 and ref_st["win_blocks"] == 0   # run_batch checked none is held


@pytest.mark.parametrize("mode", ["prefix", "sampled_n2", "preempt"])
def test_async_scheduling_same(kvllm, setup, mode):
    """Asynchronous scheduling over the sliding pool: each step planned while the previous one runs, the
    window's blocks released only once the step is done, the same ids and logits as the synchronous order."""
    d, target, _, prompts = setup
    ids, lg, st = run_batch(kvllm, d, target, prompts, f"sync_{mode}", *COMMON, *MODES[mode])
    a_ids, a_lg, a_st = run_batch(kvllm, d, target, prompts, f"async_{mode}", *COMMON, *MODES[mode],
                                  "--async-scheduling")
    assert a_st["planned_ahead"] > 0 and st["planned_ahead"] == 0
    assert a_ids == ids
    assert np.array_equal(a_lg, lg), "the logits differ from the synchronous order's"
    if mode == "prefix":
        assert a_st["cached"] > 0, a_st
    if mode == "preempt":
        assert a_st["preemptions"] > 0, a_st
    assert a_st["win_blocks"] > 0   # run_batch checked none is held


def test_window_memory_bounded(kvllm, setup):
    d, target, _, _ = setup
    prompt = [[1] + list(range(3, 11))]
    args = [*COMMON, "--max-seqs", "1", "--max-batch-tokens", "16", "--spec-ngram"]
    ids, _, st = run_batch(kvllm, d, target, prompt, "long", *args, max_tokens=391, logits=False)
    ref_ids, _, _ = run_batch(kvllm, d, target, prompt, "long_full", *args, "--kv-full", max_tokens=391,
                              logits=False)
    assert ids == ref_ids and len(ids[0]) == 391
    assert st["preemptions"] == 0, st
    assert st["win_blocks"] == 9 and st["blocks"] >= 100, st


def test_info_and_plan(kvllm, setup):
    """`kvllm info` shows the windowed bytes per sequence beside a full cache's; the plan logs both."""
    d, target, _, _ = setup
    res = run_cli(kvllm, "info", target, "--json")
    assert res.returncode == 0, res.describe()
    j = json.loads(res.out)
    head = 2 * 2 * 16 * 4   # K and V, 2 kv heads, head_dim 16, f32
    assert j["n_layer_swa"] == 6 and j["n_swa"] == WINDOW
    assert j["kv_bytes_per_token"]["f32"] == head
    # the global layer keeps 1024 positions, the six sliding ones ceil(12 / 16) + 1 blocks of 16 (32)
    assert j["kv_bytes_per_sequence"]["f32"] == head * (1024 + 6 * 32)
    assert j["kv_bytes_per_sequence_full_cache"]["f32"] == head * 7 * 1024
    res = run_cli(kvllm, "run", "-m", target, "-n", "4", "-c", "1024", "--max-seqs", "4", "--kv-tokens", "4096")
    assert res.returncode == 0, res.describe()
    assert re.search(r"6 of 7 layers slide over 12 positions and keep only their window", res.err), res.err
