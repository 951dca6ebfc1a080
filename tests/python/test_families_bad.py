"""Malformed files of the newer families are refused at load, naming the key or tensor at fault.

Each case starts from a small valid file of one family (Gemma 2 / 3, Qwen3, Qwen3-MoE, Mixtral-style
llama, Phi-3 with LongRoPE, SmolLM3, Mistral, gpt-oss) written by gen_model.py, read back into gguf_build's GGUF
(keys as their encoded bytes, tensor infos, the data section) and edited there: a key set or dropped, a
tensor dropped, given another shape over the same bytes, or replaced by new F32 data.  The cases: a window
longer than the context; an expert count of 0 (or none) with expert tensors, top-k of 0 or above the count,
an expert width or count the tensors do not have; head counts that do not divide, key and value lengths
that differ or are 0; missing q/k norms, post-norms, routers and experts; 3-D expert tensors of the wrong
shape; LongRoPE factors of the wrong length, non-positive, or one of the pair missing; rope_freqs beside
LongRoPE factors; gpt-oss without its sinks, a bias, its FFN norm or experts, or with DeepSeek's YaRN
multiplier.

For every case, `kvllm run -q` and `kvllm info`, with the release binary and (when built) the ASan one,
exit 1 with exactly one "kvllm: error:" line naming the file and the key or tensor (check_refused), and
no sanitizer report.  The unedited bases, put through the same read-back, are byte-identical to what
gen_model wrote and run: the edits alone are what is refused.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import gguf
import numpy as np
import pytest

from gen_model import ModelConfig, write_model
from gguf_build import GGML_F32, GGUF
from kvtest import check_refused, eval_logits, run_cli

TIMEOUT = 120

# Small but complete: two layers (so that a later layer's tensors are checked too), GQA, head_dim given
# by key_length where the family's converter writes it.
BASES = {
    "gemma3": ModelConfig(arch="gemma3", n_vocab=300, n_embd=32, n_layer=2, n_head=2, n_head_kv=1, key_length=16,
                          n_ff=48, n_ctx=64, n_swa=8, tied=True),
    "gemma2": ModelConfig(arch="gemma2", n_vocab=300, n_embd=32, n_layer=2, n_head=2, n_head_kv=1, key_length=16,
                          n_ff=48, n_ctx=64, n_swa=8, tied=True),
    "qwen3": ModelConfig(arch="qwen3", n_vocab=300, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, key_length=16,
                         n_ff=48, n_ctx=64),
    "qwen3moe": ModelConfig(arch="qwen3moe", n_vocab=300, n_embd=32, n_layer=2, n_head=4, n_head_kv=2,
                            key_length=16, n_ff=48, n_ff_exp=24, n_expert=4, n_expert_used=2, n_ctx=64),
    "mixtral": ModelConfig(arch="llama", n_vocab=300, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48,
                           n_expert=4, n_expert_used=2, n_ctx=64),
    # context 128 over an original 32: the long factors are the ones used
    "phi3": ModelConfig(arch="phi3", n_vocab=300, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48, n_rot=6,
                        n_ctx=128, n_ctx_orig=32, longrope=True),
    "smollm3": ModelConfig(arch="smollm3", n_vocab=300, n_embd=32, n_layer=4, n_head=4, n_head_kv=2, n_ff=48,
                           n_ctx=64),
    "gemma2_46": ModelConfig(arch="gemma2", n_vocab=300, n_embd=8, n_layer=46, n_head=2, n_head_kv=1,
                             key_length=8, n_ff=8, n_ctx=64, n_swa=8, tied=True),
    "mistral": ModelConfig(arch="mistral", n_vocab=300, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, n_ff=48,
                           n_ctx=64, n_swa=8),
    "gpt-oss": ModelConfig(arch="gpt-oss", n_vocab=300, n_embd=32, n_layer=2, n_head=4, n_head_kv=2, key_length=16,
                           n_ff=48, n_ff_exp=24, n_expert=4, n_expert_used=2, n_ctx=64, n_swa=8,
                           rope_yarn=(4.0, 16)),
}
ARCH = {b: c.arch for b, c in BASES.items()}


# ---- reading a written file back into gguf_build's editable form ------------------------------------------------

def read_gguf(path: Path) -> GGUF:
    """path as a GGUF whose render() gives the same bytes: keys kept as their encoded entries, tensor
    offsets relative to the data section."""
    r = gguf.GGUFReader(path)
    raw = Path(path).read_bytes()
    g = GGUF(align=r.alignment)
    for f in r.fields.values():
        if f.name.startswith("GGUF."):          # the reader's view of the header counts
            continue
        n = sum(int(p.nbytes) for p in f.parts)
        g.kvs.append((f.name, raw[f.offset:f.offset + n]))
    for t in r.tensors:
        g.tis.append({"name": t.name, "ne": [int(x) for x in t.shape], "type": int(t.tensor_type),
                      "offset": int(t.data_offset) - r.data_offset})
    g.data = raw[r.data_offset:]
    return g


def _set(key_suffix: str, v: int) -> Callable[[GGUF, str], None]:
    def fn(g: GGUF, arch: str) -> None:
        g.set_u32(f"{arch}.{key_suffix}", v)
    return fn


def _set_f32(key_suffix: str, v: float) -> Callable[[GGUF, str], None]:
    def fn(g: GGUF, arch: str) -> None:
        g.set_f32(f"{arch}.{key_suffix}", v)
    return fn


def _drop(key_suffix: str) -> Callable[[GGUF, str], None]:
    def fn(g: GGUF, arch: str) -> None:
        g.drop(f"{arch}.{key_suffix}")
    return fn


def _drop_tensor(name: str) -> Callable[[GGUF, str], None]:
    def fn(g: GGUF, arch: str) -> None:
        n = len(g.tis)
        g.drop_tensor(name)
        assert len(g.tis) == n - 1, f"no tensor {name}"
    return fn


def _reshape(name: str, ne: Callable[[list[int]], list[int]]) -> Callable[[GGUF, str], None]:
    """The tensor's ne (GGUF order) changed over the same bytes: the element count must not change."""
    def fn(g: GGUF, arch: str) -> None:
        t = g.tensor(name)
        new = ne(list(t["ne"]))
        assert int(np.prod(new)) == int(np.prod(t["ne"])), (name, t["ne"], new)
        t["ne"] = new
    return fn


def _put_f32(name: str, values: Callable[[int], np.ndarray]) -> Callable[[GGUF, str], None]:
    """Tensor `name` (added, or replacing the one there) as F32 values(old length or 0)."""
    def fn(g: GGUF, arch: str) -> None:
        old = next((t for t in g.tis if t["name"] == name), None)
        a = np.ascontiguousarray(values(int(np.prod(old["ne"])) if old else 0), dtype="<f4")
        g.drop_tensor(name)
        pad = (-len(g.data)) % g.align
        g.tis.append({"name": name, "ne": list(reversed(a.shape)), "type": GGML_F32, "offset": len(g.data) + pad})
        g.data = g.data + b"\0" * pad + a.tobytes()
    return fn


def _both(*fns: Callable[[GGUF, str], None]) -> Callable[[GGUF, str], None]:
    def fn(g: GGUF, arch: str) -> None:
        for f in fns:
            f(g, arch)
    return fn


ROT_HALF = BASES["phi3"].n_rot // 2
ramp = lambda n: np.linspace(1.0, 2.0, n)

# case -> (base, edit, what the error line must name)
CASES: dict[str, tuple[str, Callable[[GGUF, str], None], str]] = {
    # windows
    "gemma3_window_past_context": ("gemma3", _set("attention.sliding_window", 65), "gemma3.attention.sliding_window"),
    "gemma2_window_past_context": ("gemma2", _set("attention.sliding_window", 1 << 20),
                                   "gemma2.attention.sliding_window"),
    "mistral_window_past_context": ("mistral", _set("attention.sliding_window", 100),
                                    "mistral.attention.sliding_window"),
    # expert counts
    "mixtral_expert_count_0": ("mixtral", _set("expert_count", 0), "blk.0.ffn_gate_exps.weight"),
    "mixtral_no_expert_count": ("mixtral", _drop("expert_count"), "blk.0.ffn_gate_exps.weight"),
    "qwen3moe_expert_count_0": ("qwen3moe", _set("expert_count", 0), "blk.0.ffn_gate_exps.weight"),
    "mixtral_used_above_count": ("mixtral", _set("expert_used_count", 5), "llama.expert_used_count"),
    # gpt-oss: its sinks and every bias are required; its FFN is experts only
    "gptoss_expert_count_0": ("gpt-oss", _set("expert_count", 0), "blk.0.ffn_gate_exps.weight"),
    "gptoss_dense": ("gpt-oss", _both(_drop("expert_count"), *(_drop_tensor(f"blk.{il}.ffn_{w}_exps.weight")
                                                               for il in (0, 1) for w in ("gate", "up", "down"))),
                     "gpt-oss.expert_count"),
    "gptoss_used_above_count": ("gpt-oss", _set("expert_used_count", 5), "gpt-oss.expert_used_count"),
    "gptoss_no_sinks": ("gpt-oss", _drop_tensor("blk.1.attn_sinks.weight"), "blk.1.attn_sinks.weight"),
    "gptoss_sinks_wrong_shape": ("gpt-oss", _reshape("blk.0.attn_sinks.weight", lambda ne: [ne[0] // 2, 2]),
                                 "blk.0.attn_sinks.weight"),
    "gptoss_no_q_bias": ("gpt-oss", _drop_tensor("blk.0.attn_q.bias"), "blk.0.attn_q.bias"),
    "gptoss_no_out_bias": ("gpt-oss", _drop_tensor("blk.1.attn_output.bias"), "blk.1.attn_output.bias"),
    "gptoss_no_router_bias": ("gpt-oss", _drop_tensor("blk.0.ffn_gate_inp.bias"), "blk.0.ffn_gate_inp.bias"),
    "gptoss_no_up_exps_bias": ("gpt-oss", _drop_tensor("blk.1.ffn_up_exps.bias"), "blk.1.ffn_up_exps.bias"),
    "gptoss_down_exps_bias_1d": ("gpt-oss", _reshape("blk.0.ffn_down_exps.bias", lambda ne: [ne[0] * ne[1]]),
                                 "blk.0.ffn_down_exps.bias"),
    "gptoss_no_ffn_norm": ("gpt-oss", _drop_tensor("blk.1.post_attention_norm.weight"),
                           "blk.1.post_attention_norm.weight"),
    "gptoss_yarn_log_multiplier": ("gpt-oss", _set_f32("rope.scaling.yarn_log_multiplier", 0.1),
                                   "gpt-oss.rope.scaling.yarn_log_multiplier"),
    "qwen3moe_used_0": ("qwen3moe", _set("expert_used_count", 0), "qwen3moe.expert_used_count"),
    "qwen3moe_no_used_count": ("qwen3moe", _drop("expert_used_count"), "qwen3moe.expert_used_count"),
    "mixtral_count_above_tensors": ("mixtral", _set("expert_count", 8), "blk.0.ffn_gate_inp.weight"),
    "qwen3moe_count_below_tensors": ("qwen3moe", _set("expert_count", 3), "blk.0.ffn_gate_inp.weight"),
    "qwen3moe_expert_width_differs": ("qwen3moe", _set("expert_feed_forward_length", 12),
                                      "blk.0.ffn_gate_exps.weight"),
    # expert tensors
    "mixtral_no_router": ("mixtral", _drop_tensor("blk.0.ffn_gate_inp.weight"), "blk.0.ffn_gate_inp.weight"),
    "qwen3moe_no_router_layer1": ("qwen3moe", _drop_tensor("blk.1.ffn_gate_inp.weight"),
                                  "blk.1.ffn_gate_inp.weight"),
    "qwen3moe_router_wrong_shape": ("qwen3moe", _reshape("blk.0.ffn_gate_inp.weight", lambda ne: [ne[0] * 2, ne[1] // 2]),
                                    "blk.0.ffn_gate_inp.weight"),
    "mixtral_no_down_exps": ("mixtral", _drop_tensor("blk.1.ffn_down_exps.weight"), "blk.1.ffn_down_exps.weight"),
    "mixtral_up_exps_transposed": ("mixtral", _reshape("blk.0.ffn_up_exps.weight", lambda ne: [ne[1], ne[0], ne[2]]),
                                   "blk.0.ffn_up_exps.weight"),
    "qwen3moe_down_exps_2d": ("qwen3moe", _reshape("blk.1.ffn_down_exps.weight", lambda ne: [ne[0], ne[1] * ne[2]]),
                              "blk.1.ffn_down_exps.weight"),
    "qwen3moe_gate_exps_half_the_experts": ("qwen3moe", _reshape("blk.0.ffn_gate_exps.weight",
                                                                 lambda ne: [ne[0], ne[1] * 2, ne[2] // 2]),
                                            "blk.0.ffn_gate_exps.weight"),
    "mixtral_gate_exps_4d": ("mixtral", _reshape("blk.0.ffn_gate_exps.weight",
                                                 lambda ne: [ne[0], ne[1], ne[2] // 2, 2]),
                             "blk.0.ffn_gate_exps.weight"),
    # heads
    "qwen3_kv_heads_not_dividing": ("qwen3", _set("attention.head_count_kv", 3), "qwen3.attention.head_count_kv"),
    "gemma3_kv_heads_above_heads": ("gemma3", _set("attention.head_count_kv", 4), "gemma3.attention.head_count_kv"),
    "smollm3_heads_not_dividing_embd": ("smollm3", _set("attention.head_count", 3), "smollm3.attention.head_count"),
    "phi3_heads_not_dividing_embd": ("phi3", _set("attention.head_count", 5), "phi3.attention.head_count"),
    "gemma3_value_length_differs": ("gemma3", _set("attention.value_length", 8), "gemma3.attention.value_length"),
    "qwen3_value_length_only_differs": ("qwen3", _both(_drop("attention.key_length"), _set("attention.value_length", 16)),
                                        "qwen3.attention.value_length"),
    "qwen3_key_length_0": ("qwen3", _set("attention.key_length", 0), "qwen3.attention.key_length"),
    "gemma2_key_length_odd": ("gemma2", _both(_set("attention.key_length", 15), _set("attention.value_length", 15)),
                              "gemma2.attention.key_length"),
    # Gemma 2's 27B shape (46 layers) scales by n_embd / n_head, which these heads do not divide
    "gemma2_46_layers_scale": ("gemma2_46", _set("attention.head_count", 3), "gemma2.attention.head_count"),
    "qwen3_key_length_vs_tensors": ("qwen3", _both(_set("attention.key_length", 8), _set("attention.value_length", 8)),
                                    "blk.0.attn_q.weight"),
    # norms
    "qwen3_no_attn_q_norm": ("qwen3", _drop_tensor("blk.0.attn_q_norm.weight"), "blk.0.attn_q_norm.weight"),
    "qwen3moe_no_attn_k_norm": ("qwen3moe", _drop_tensor("blk.1.attn_k_norm.weight"), "blk.1.attn_k_norm.weight"),
    "gemma3_no_attn_q_norm": ("gemma3", _drop_tensor("blk.1.attn_q_norm.weight"), "blk.1.attn_q_norm.weight"),
    "gemma3_no_post_attention_norm": ("gemma3", _drop_tensor("blk.0.post_attention_norm.weight"),
                                      "blk.0.post_attention_norm.weight"),
    "gemma2_no_post_ffw_norm": ("gemma2", _drop_tensor("blk.1.post_ffw_norm.weight"), "blk.1.post_ffw_norm.weight"),
    "gemma3_no_ffn_norm": ("gemma3", _drop_tensor("blk.0.ffn_norm.weight"), "blk.0.ffn_norm.weight"),
    "gemma3_q_norm_embd_wide": ("gemma3", _put_f32("blk.0.attn_q_norm.weight", lambda n: np.ones(32)),
                                "blk.0.attn_q_norm.weight"),
    "smollm3_no_output_norm": ("smollm3", _drop_tensor("output_norm.weight"), "output_norm.weight"),
    # Phi-3: fused tensors and LongRoPE
    "phi3_qkv_transposed": ("phi3", _reshape("blk.0.attn_qkv.weight", lambda ne: [ne[1], ne[0]]),
                            "blk.0.attn_qkv.weight"),
    "phi3_gate_up_not_fused": ("phi3", _reshape("blk.1.ffn_up.weight", lambda ne: [ne[0] * 2, ne[1] // 2]),
                               "blk.1.ffn_up.weight"),
    "phi3_long_factors_short": ("phi3", _put_f32("rope_factors_long.weight", lambda n: ramp(n - 1)),
                                "rope_factors_long.weight"),
    "phi3_short_factors_long": ("phi3", _put_f32("rope_factors_short.weight", lambda n: ramp(n + 2)),
                                "rope_factors_short.weight"),
    "phi3_short_factors_negative": ("phi3", _put_f32("rope_factors_short.weight", lambda n: -ramp(n)),
                                    "rope_factors_short.weight"),
    "phi3_long_factors_zero": ("phi3", _put_f32("rope_factors_long.weight", lambda n: np.zeros(n)),
                               "rope_factors_long.weight"),
    "phi3_no_long_factors": ("phi3", _drop_tensor("rope_factors_long.weight"), "rope_factors_long.weight"),
    "phi3_no_short_factors": ("phi3", _drop_tensor("rope_factors_short.weight"), "rope_factors_short.weight"),
    "phi3_rope_freqs_and_factors": ("phi3", _put_f32("rope_freqs.weight", lambda n: ramp(ROT_HALF)),
                                    "rope_freqs.weight"),
    "phi3_rope_freqs_and_short_factors": ("phi3", _both(_drop_tensor("rope_factors_long.weight"),
                                                        _put_f32("rope_freqs.weight", lambda n: ramp(ROT_HALF))),
                                          "rope_freqs.weight"),
    "mixtral_rope_freqs_and_long_factors": ("mixtral", _both(
        _put_f32("rope_freqs.weight", lambda n: ramp(4)), _put_f32("rope_factors_long.weight", lambda n: ramp(4)),
        _put_f32("rope_factors_short.weight", lambda n: ramp(4))), "rope_freqs.weight"),
}


# ---- files ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("families_bad_base")
    return {b: write_model(d / f"{b}.gguf", dataclasses.replace(cfg, name=f"bad-{b}"), seed=60 + i)
            for i, (b, cfg) in enumerate(BASES.items())}


@pytest.fixture(scope="module")
def files(tmp_path_factory, bases) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("families_bad")
    out = {}
    for case, (base, edit, _) in CASES.items():
        g = read_gguf(bases[base])
        edit(g, ARCH[base])
        p = d / f"{case}.gguf"
        p.write_bytes(g.render())
        out[case] = p
    return out


# ---- tests ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("base", list(BASES))
def test_bases_are_valid(kvllm, bases, tmp_path, base):
    """Read back unedited, each base renders to the bytes gen_model wrote, and kvllm runs it: what the cases
    below refuse is their edit alone."""
    g = read_gguf(bases[base])
    p = tmp_path / "again.gguf"
    p.write_bytes(g.render())
    assert p.read_bytes() == bases[base].read_bytes()
    res = run_cli(kvllm, "info", p, timeout=TIMEOUT)
    assert res.returncode == 0 and "warn" not in res.err.lower(), res.describe()
    logits = eval_logits(kvllm, p, [1, 7, 42, 250, 3, 99], tmp_path / "l.bin")
    assert np.isfinite(logits).all() and np.std(logits[-1]) > 1e-3


def _check(res, path: Path, what: str, quiet: bool) -> None:
    check_refused(res, path.name, quiet=quiet)
    err = next(ln for ln in res.err.splitlines() if ln.startswith("kvllm: error:"))
    assert what in err, f"the error should name {what!r}: {err!r}"


@pytest.mark.parametrize("case", list(CASES))
def test_run_refuses(binary, files, case):
    res = run_cli(binary, "run", "-m", files[case], "-n", "4", "-q", timeout=TIMEOUT)
    _check(res, files[case], CASES[case][2], quiet=True)


@pytest.mark.parametrize("case", list(CASES))
def test_info_refuses(binary, files, case):
    res = run_cli(binary, "info", files[case], timeout=TIMEOUT)
    _check(res, files[case], CASES[case][2], quiet=False)
