"""Mixtures of experts as Hugging Face folders: Mixtral (MixtralForCausalLM: block_sparse_moe.gate and
block_sparse_moe.experts.E.w1/w3/w2) and Qwen3-MoE (Qwen3MoeForCausalLM: mlp.gate and
mlp.experts.E.gate_proj/up_proj/down_proj, moe_intermediate_size).

The folders hold the weights of test_families.py's random GGUF mixtures (llama with experts, qwen3moe), one
2-D tensor per expert as Transformers saves them, so the folder must give the GGUF's logits bit for bit (the
experts are read in place, as views of the mapping, in the same dtype) and so the numpy reference's
(ref_llama.py, written from modeling_mixtral.py / modeling_qwen3_moe.py).  Folders kvllm cannot run as
written are refused naming the field or tensor: no experts, more experts per token than experts, an expert
missing, Qwen3-MoE's unnormalized routing and dense layers.
"""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from kvtest import check_refused, eval_logits, run_cli
from gen_model import ModelConfig
from ref_llama import rel_err
from test_archs import HF_LLAMA_LAYER, TOL, _safetensors, make_cases
from test_families import CONFIGS as FAMILIES

# the mixtures HF can express (q8_0 cannot be written to safetensors), and a Mixtral whose config declares a
# sliding window (every layer attends the last 6 positions, as Transformers' Mixtral runs it)
CONFIGS = {**{k: FAMILIES[k] for k in ("mixtral_f32_4x2", "qwen3moe_f32_8x2", "qwen3moe_f16_7x3_tied")},
           "mixtral_f16_swa6": ModelConfig(arch="llama", n_vocab=320, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                           n_ff=48, n_expert=4, n_expert_used=2, n_swa=6, dtype="f16")}
N_TOKENS = 20
SHARDS = {"qwen3moe_f16_7x3_tied": 3}   # experts spread over shards, and an index

EXPERT_NAMES = {"llama": ("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}),
                "qwen3moe": ("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})}
QK_NORM = {"attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight"}


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return make_cases(tmp_path_factory.mktemp("moe"), CONFIGS, seed=500, token_seed=40, n_tokens=N_TOKENS)


def hf_tensors(gguf_path, cfg) -> dict[str, np.ndarray]:
    """The GGUF's tensors under Transformers' names: experts split one per tensor, llama's Q/K rows back to
    the halves order (qwen3moe keeps it)."""
    block, proj = EXPERT_NAMES[cfg.arch]
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    out = {}
    for t in gguf.GGUFReader(gguf_path).tensors:
        a = np.asarray(t.data).reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
        if t.name in top:
            out[top[t.name]] = a
            continue
        _, il, rest = t.name.split(".", 2)
        pre = f"model.layers.{il}."
        if rest.endswith("_exps.weight"):
            kind = rest[len("ffn_"):-len("_exps.weight")]
            for e in range(a.shape[0]):
                out[f"{pre}{block}.experts.{e}.{proj[kind]}.weight"] = a[e]
        elif rest == "ffn_gate_inp.weight":
            out[f"{pre}{block}.gate.weight"] = a
        elif rest in QK_NORM:
            out[pre + QK_NORM[rest]] = a
        else:
            if cfg.arch == "llama" and rest in ("attn_q.weight", "attn_k.weight"):
                nh = cfg.n_head if rest == "attn_q.weight" else cfg.n_head_kv
                a = a.reshape(nh, cfg.head_dim // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)
            out[pre + HF_LLAMA_LAYER[rest]] = a
    return out


def hf_config(cfg) -> dict:
    c = {"hidden_size": cfg.n_embd, "intermediate_size": cfg.n_ff, "num_hidden_layers": cfg.n_layer,
         "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head_kv,
         "max_position_embeddings": cfg.n_ctx, "vocab_size": cfg.n_vocab, "rms_norm_eps": cfg.norm_eps,
         "rope_theta": cfg.rope_theta, "tie_word_embeddings": cfg.tied, "hidden_act": "silu",
         "num_experts_per_tok": cfg.n_expert_used}
    if cfg.arch == "llama":
        c.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=cfg.n_expert,
                 sliding_window=cfg.n_swa or None, router_jitter_noise=0.0, output_router_logits=False)
    else:
        c.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=cfg.n_expert,
                 moe_intermediate_size=cfg.ff_exp, head_dim=cfg.head_dim, norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False, sliding_window=None)
    return c


def write_folder(folder, tensors: dict[str, np.ndarray], config: dict, shards: int = 1):
    """config.json and the tensors in one model.safetensors, or in `shards` shards with an index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if shards == 1:
        (folder / "model.safetensors").write_bytes(_safetensors(tensors))
        return folder
    names, weight_map = sorted(tensors), {}
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        (folder / fn).write_bytes(_safetensors(part))
        weight_map.update({n: fn for n in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("mode", [dict(), dict(prefill=1), dict(prefill=7)], ids=["prefill_all", "prefill_1",
                                                                                   "prefill_7"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_hf_moe_matches_gguf_and_reference(kvllm, cases, tmp_path, config, mode):
    cfg, c = CONFIGS[config], cases[config]
    assert c.model.hp.n_swa == cfg.n_swa   # the reference runs the window the config declares
    folder = write_folder(tmp_path / "hf", hf_tensors(c.path, cfg), hf_config(cfg), shards=SHARDS.get(config, 1))
    got = eval_logits(kvllm, folder, c.tokens, tmp_path / "hf.bin", **mode)
    ref_err = rel_err(got, c.ref).max()
    assert ref_err <= TOL, f"{config}: HF vs reference {ref_err:.3g}"
    gg = eval_logits(kvllm, c.path, c.tokens, tmp_path / "gguf.bin", **mode)
    assert np.array_equal(got, gg), f"{config}: HF vs GGUF {rel_err(got, gg).max():.3g}"


def test_hf_moe_info(run, cases, tmp_path):
    """`kvllm info` on the folders: the GGUF architecture and the expert counts."""
    for config in ("mixtral_f32_4x2", "qwen3moe_f32_8x2"):
        cfg = CONFIGS[config]
        folder = write_folder(tmp_path / config, hf_tensors(cases[config].path, cfg), hf_config(cfg))
        r = run("info", "-m", folder).check_ok()
        assert f"architecture      {cfg.arch}" in r.out, r.out
        g = run("info", "-m", cases[config].path).check_ok()
        # the same parameter count as the GGUF: every expert was found
        pl = lambda out: [ln for ln in out.splitlines() if ln.startswith("parameters")]
        assert pl(r.out) and pl(r.out) == pl(g.out), (r.out, g.out)


@pytest.mark.parametrize("config", ["mixtral_f32_4x2", "qwen3moe_f16_7x3_tied"])
def test_convert_stacks_experts(run, cases, tmp_path, config):
    """`kvllm convert` of a folder writes the experts stacked, as GGUF files and llama.cpp's converter have
    them: the same tensors as the GGUF the folder was made from, byte for byte."""
    cfg, c = CONFIGS[config], cases[config]
    folder = write_folder(tmp_path / "hf", hf_tensors(c.path, cfg), hf_config(cfg), shards=SHARDS.get(config, 1))
    out = tmp_path / "back.gguf"
    run("convert", folder, "-o", out).check_ok()
    want = {t.name: t for t in gguf.GGUFReader(c.path).tensors}
    got = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert got[name].shape.tolist() == t.shape.tolist() and got[name].tensor_type == t.tensor_type, name
        assert np.array_equal(np.asarray(got[name].data), np.asarray(t.data)), name


def test_hf_moe_asan(asan_bin, cases, tmp_path):
    """Under AddressSanitizer: a folder with its experts over shards, and a refused one."""
    cfg, c = CONFIGS["qwen3moe_f16_7x3_tied"], cases["qwen3moe_f16_7x3_tied"]
    tensors = hf_tensors(c.path, cfg)
    folder = write_folder(tmp_path / "hf", tensors, hf_config(cfg), shards=3)
    got = eval_logits(asan_bin, folder, c.tokens, tmp_path / "l.bin", prefill=7)
    assert rel_err(got, c.ref).max() <= TOL
    config, t = _bad(cfg, tensors, drop="model.layers.2.mlp.experts.6.up_proj.weight")
    check_refused(run_cli(asan_bin, "info", "-m", write_folder(tmp_path / "bad", t, config)),
                  "model.layers.2.mlp.experts.6.up_proj.weight", quiet=False)


def _bad(cfg, tensors, **changes):
    c = hf_config(cfg)
    drop = changes.pop("drop", None)
    for k, v in changes.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    t = {k: v for k, v in tensors.items() if k != drop}
    return c, t


def test_bad_moe_folders_refused(run, cases, tmp_path):
    mix, qwen = CONFIGS["mixtral_f32_4x2"], CONFIGS["qwen3moe_f32_8x2"]
    tm, tq = hf_tensors(cases["mixtral_f32_4x2"].path, mix), hf_tensors(cases["qwen3moe_f32_8x2"].path, qwen)
    bad = {
        "no_experts": (_bad(mix, tm, num_local_experts=0), "num_local_experts"),
        "experts_missing_key": (_bad(mix, tm, num_local_experts=None), "num_local_experts"),
        "topk_over_experts": (_bad(mix, tm, num_experts_per_tok=5), "num_experts_per_tok 5"),
        "missing_expert": (_bad(mix, tm, drop="model.layers.1.block_sparse_moe.experts.2.w3.weight"),
                           "model.layers.1.block_sparse_moe.experts.2.w3.weight"),
        "missing_router": (_bad(mix, tm, drop="model.layers.0.block_sparse_moe.gate.weight"),
                           "model.layers.0.block_sparse_moe.gate.weight"),
        "qwen_missing_expert": (_bad(qwen, tq, drop="model.layers.0.mlp.experts.7.down_proj.weight"),
                                "model.layers.0.mlp.experts.7.down_proj.weight"),
        "qwen_unnormalized": (_bad(qwen, tq, norm_topk_prob=False), "norm_topk_prob"),
        "qwen_norm_default": (_bad(qwen, tq, norm_topk_prob=None), "norm_topk_prob"),
        "qwen_dense_layers": (_bad(qwen, tq, mlp_only_layers=[1]), "mlp_only_layers"),
        "qwen_sparse_step": (_bad(qwen, tq, decoder_sparse_step=2), "decoder_sparse_step"),
        "qwen_no_width": (_bad(qwen, tq, moe_intermediate_size=None), "moe_intermediate_size"),
    }
    for name, ((config, tensors), want) in bad.items():
        folder = write_folder(tmp_path / name, tensors, config)
        check_refused(run("info", "-m", folder), want, quiet=False)
