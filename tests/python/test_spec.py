"""Speculative decoding through `kvllm batch`: only the speed may change.

The reference is the same binary without speculation.  With prompt lookup (--spec-ngram) and with a
draft model (--draft-model: a random small draft for a random target of the same vocabulary, which
exercises rejection, and a model drafting for itself, which accepts every greedy draft), 32 prompts
give the same ids and bit-identical logits (f32 KV) as plain decoding: one sequence at a time
(--max-seqs 1) and all under continuous batching, greedy and sampled, under preemption; SmolLM2
likewise, greedy.  No KV block is held after any run.  At temperature 1 a two-sample chi-squared
test compares the token distribution with speculation against the one without, on disjoint seeds.
"""
from __future__ import annotations

import functools
import math
import re

import numpy as np
import pytest

from gen_model import ModelConfig, write_model
from kvtest import run_batch as _run_batch
from kvtest import mpi_np, run_cli

N_PROMPTS = 32
MAX_TOKENS = 24
N_VOCAB = 320
run_batch = functools.partial(_run_batch, n_vocab=N_VOCAB, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    target = write_model(d / "target.gguf", ModelConfig(n_vocab=N_VOCAB, n_embd=64, n_layer=2, n_head=8,
                                                        n_head_kv=2, n_ff=160, n_ctx=512), seed=11)
    draft = write_model(d / "draft.gguf", ModelConfig(n_vocab=N_VOCAB, n_embd=32, n_layer=1, n_head=4,
                                                      n_head_kv=2, n_ff=64, n_ctx=512), seed=12)
    rng = np.random.default_rng(7)
    prompts = []
    for i in range(N_PROMPTS):
        # a random phrase said two or three times: prompt lookup finds something to copy
        phrase = rng.integers(3, N_VOCAB, size=int(rng.integers(2, 12))).tolist()
        prompts.append([1] + phrase * int(rng.integers(2, 4)) + rng.integers(3, N_VOCAB, size=3).tolist())
    return d, target, draft, prompts


MODES = {
    "ngram": lambda t, dr: ["--spec-ngram"],
    "ngram_k8": lambda t, dr: ["--spec-ngram", "--spec-tokens", "8", "--spec-ngram-max", "4"],
    "draft_random": lambda t, dr: ["--draft-model", dr, "--spec-tokens", "4"],
    "draft_self": lambda t, dr: ["--draft-model", t, "--draft-max", "3"],
}
LAYOUTS = {
    "alone": ["--max-seqs", "1"],
    "batched": [],
    "preempt": ["--kv-tokens", "128", "--max-batch-tokens", "16"],
}
SAMPLING = {"greedy": [], "sampled": ["--temp", "1.0", "--seed", "5", "--n", "2"]}


def layout(lay, smp):
    """Engine options of a layout; alone: one request at a time (its two samples together when n = 2)."""
    return ["--max-seqs", "2"] if (lay, smp) == ("alone", "sampled") else LAYOUTS[lay]


@pytest.fixture(scope="module")
def reference(kvllm, setup):
    d, target, _, prompts = setup
    return {(lay, smp): run_batch(kvllm, d, target, prompts, f"ref_{lay}_{smp}", *layout(lay, smp), *SAMPLING[smp])
            for lay in LAYOUTS for smp in SAMPLING}


@pytest.mark.parametrize("smp", list(SAMPLING))
@pytest.mark.parametrize("lay", list(LAYOUTS))
@pytest.mark.parametrize("mode", list(MODES))
def test_identical_to_plain_decoding(kvllm, setup, reference, mode, lay, smp):
    d, target, draft, prompts = setup
    ref_ids, ref_logits, ref_stats = reference[(lay, smp)]
    ids, logits, stats = run_batch(kvllm, d, target, prompts, f"{mode}_{lay}_{smp}", *layout(lay, smp),
                                   *SAMPLING[smp], *MODES[mode](target, draft))
    assert ids == ref_ids
    assert np.array_equal(logits, ref_logits), "the logits of the sampled tokens differ"
    sp = stats["spec"]
    assert sp and sp["drafted"] > 0, "nothing was drafted"
    if lay == "preempt":
        assert stats["preemptions"] > 0 and ref_stats["preemptions"] > 0
    if mode == "draft_self" and smp == "greedy":
        assert sp["accepted"] == sp["drafted"], f"a model drafting for itself greedily had drafts rejected: {sp}"
    if mode == "draft_random":
        # a random draft for a random target: rejection is exercised (and some drafts are still right)
        assert 0 < sp["accepted"] < sp["drafted"], sp


def chi2_two_sample(a: list[int], b: list[int]) -> tuple[float, int]:
    """Pearson chi-squared statistic of two samples over the values seen, bins with fewer than 10 pooled
    observations merged into one; returns (statistic, degrees of freedom)."""
    vals = sorted(set(a) | set(b))
    ca = np.array([a.count(v) for v in vals], dtype=float)
    cb = np.array([b.count(v) for v in vals], dtype=float)
    small = (ca + cb) < 10
    if small.any():
        ca = np.append(ca[~small], ca[small].sum())
        cb = np.append(cb[~small], cb[small].sum())
    na, nb = ca.sum(), cb.sum()
    tot = ca + cb
    ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    keep = tot > 0
    stat = float((((ca - ea) ** 2 / ea)[keep]).sum() + (((cb - eb) ** 2 / eb)[keep]).sum())
    return stat, int(keep.sum()) - 1


def chi2_sf(x: float, k: int) -> float:
    """P(chi2_k > x) by the Wilson-Hilferty cube-root normal approximation (close enough for k >= 3
    at the 0.1 % level; no scipy in the test venv)."""
    z = ((x / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def test_chi2_helpers():
    """The statistic and tail against values from tables: identical samples give 0; chi2_10 > 23.21 is 1 %."""
    assert chi2_two_sample([1, 2, 3] * 20, [1, 2, 3] * 20) == (0.0, 2)
    assert abs(chi2_sf(23.209, 10) - 0.01) < 0.001
    assert abs(chi2_sf(9.342, 10) - 0.5) < 0.01


def test_sampled_distribution_chi2(kvllm, setup):
    """Temperature 1: 1,200 samples with the random draft model against 1,200 without, on disjoint
    seeds; for each of positions 2..4 (verified against drafts) the two-sample chi-squared test must
    not reject at 0.1 % (a wrong acceptance rule shifts these distributions far beyond that)."""
    d, target, draft, prompts = setup
    p = [prompts[0]]
    base, spec = [], []
    for r in range(4):
        common = ["--temp", "1.0", "--n", "300", "--max-seqs", "300", "--kv-tokens", "16384"]
        base += run_batch(kvllm, d, target, p, f"chi_base{r}", *common, "--seed", str(1 + 1000 * r),
                          max_tokens=5, logits=False)[0]
        ids, _, st = run_batch(kvllm, d, target, p, f"chi_spec{r}", *common, "--seed", str(500001 + 1000 * r),
                               "--draft-model", draft, "--spec-tokens", "3", max_tokens=5, logits=False)
        assert st["spec"]["drafted"] > 0
        spec += ids
    for pos in (1, 2, 3, 4):
        stat, dof = chi2_two_sample([s[pos] for s in base], [s[pos] for s in spec])
        assert dof >= 3, f"position {pos}: only {dof + 1} bins"
        pval = chi2_sf(stat, dof)
        assert pval > 1e-3, f"position {pos}: chi2 {stat:.1f} on {dof} dof, p = {pval:.2g}"


SMOL_TOKENS = 16


@pytest.fixture(scope="module")
def smol(kvllm, smollm2, shared, tmp_path_factory):
    """32 SmolLM2 prompts (lines of the GPL, every other one asking for a copy of itself) and their
    greedy outputs without speculation, one at a time and batched."""
    d = tmp_path_factory.mktemp("spec_smol")
    lines = [ln.strip() for ln in (shared / "text" / "gpl-3.txt").read_text().splitlines()
             if len(ln.strip()) > 40][:N_PROMPTS]
    assert len(lines) == N_PROMPTS
    prompts = []
    for i, ln in enumerate(lines):
        t = f"Repeat this line exactly: {ln}\n{ln}\n" if i % 2 else ln
        res = run_cli(kvllm, "tokenize", "-m", smollm2, "--ids", t)
        assert res.returncode == 0, res.describe()
        prompts.append(list(map(int, re.findall(r"-?\d+", res.out))))
    refs = {lay: run_batch(kvllm, d, smollm2, prompts, f"s_ref_{lay}", *SMOL_LAYOUTS[lay], max_tokens=SMOL_TOKENS,
                           logits=False)[0] for lay in SMOL_LAYOUTS}
    return d, prompts, refs


SMOL_LAYOUTS = {"alone": ["--max-seqs", "1"], "batched": []}


@pytest.mark.parametrize("mode", ["ngram", "draft_self"])
def test_smollm2_greedy_identical(kvllm, smollm2, smol, mode):
    """SmolLM2-135M, greedy, one at a time and batched: the same ids with speculation as without; drafting
    for itself, every draft is accepted."""
    d, prompts, refs = smol
    extra = ["--spec-ngram"] if mode == "ngram" else ["--draft-model", smollm2]
    for lay in SMOL_LAYOUTS:
        got = run_batch(kvllm, d, smollm2, prompts, f"s_{mode}_{lay}", *SMOL_LAYOUTS[lay], *extra,
                        max_tokens=SMOL_TOKENS, logits=False)
        assert got[0] == refs[lay], f"{mode}, {lay}: speculation changed SmolLM2's greedy output"
        sp = got[2]["spec"]
        assert sp and sp["drafted"] > 0
        if mode == "draft_self" and mpi_np() == 1:
            assert sp["accepted"] == sp["drafted"], sp
        elif mode == "draft_self":
            # under tensor parallelism the draft runs whole on rank 0 and the target split over the ranks: two
            # roundings of the same model (docs/TP.md, "Accuracy"), whose greedy choices differ where the top two
            # logits are that close, so a few drafts are rejected (the output above is still the plain one)
            assert sp["accepted"] >= 0.9 * sp["drafted"], sp


@pytest.mark.parametrize("mode", ["--spec-ngram", "--draft-model"])
def test_serve_metrics_acceptance(kvllm, stories, mode):
    """kvllm serve with speculation: completions equal those of a server without it (greedy, and
    sampled with a seed), /metrics reports the drafts and the acceptance rate, and no block is held."""
    from server_util import Server  # noqa: PLC0415
    base = ["-m", stories["bin"], "--tokenizer", stories["tok"], "-t", "1"]
    spec = ["--spec-ngram"] if mode == "--spec-ngram" else ["--draft-model", stories["bin"], "--spec-tokens", "3"]
    reqs = [{"prompt": f"Once upon a time {w}", "max_tokens": 40, "temperature": t, "seed": 3}
            for w in ("Lily", "Tom", "the cat") for t in (0.0, 0.9)]
    texts = {}
    for name, args in (("plain", base), ("spec", base + spec)):
        s = Server(kvllm, *args)
        try:
            texts[name] = []
            for body in reqs:
                st, out = s.post("/v1/completions", body)
                assert st == 200, out
                texts[name].append(out["choices"][0]["text"])
            m = s.wait_blocks_released()
        finally:
            rc, err = s.stop()
        assert rc == 0, err[-4000:]
        assert m['kvllm_kv_blocks{state="held"}'] == 0
        if name == "spec":
            assert m["kvllm_spec_draft_tokens_total"] > 0
            assert 0 < m["kvllm_spec_acceptance_rate"] <= 1
            assert m["kvllm_spec_accepted_tokens_total"] == pytest.approx(
                m["kvllm_spec_acceptance_rate"] * m["kvllm_spec_draft_tokens_total"], rel=1e-4)
        else:
            assert m["kvllm_spec_draft_tokens_total"] == 0
    assert texts["spec"] == texts["plain"]
