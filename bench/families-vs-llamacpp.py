#!/usr/bin/env python3
"""Every family of gen_model.py against llama.cpp: random-weight F32 / F16 files with a real vocabulary,
teacher-forced over real English, mean KL divergence and top-1 agreement of kvllm against llama.cpp.

    .venv/bin/python bench/families-vs-llamacpp.py [--dir /tmp/famkld] [--types f32,f16]
        [--families qwen3,gemma3,...] [--n-tokens 1024] [--text FILE] [--kvllm build/kvllm] [--json OUT]

For each family and weight type:
  1. gen_model.write_model writes the file as llama.cpp's converter would, with the Llama 2 SentencePiece
     vocabulary of tests/data/tokenizers/llamacpp-vocab/ggml-vocab-llama-spm.gguf (32,000 real tokens; phi3
     files Phi-3's, ggml-vocab-phi-3.gguf, 32,064), so that "the same tokens" is a claim about a real
     tokenizer and the head is as wide as a real one.
  2. The first --n-tokens tokens of --text (default gpl-3.txt), as `kvllm tokenize --ids` makes them, are
     compared with what llama.cpp's tokenizer (llama_cpp.Llama.tokenize, BOS added) makes of the same text.
  3. Both engines are teacher-forced over kvllm's ids: `kvllm eval --kv-type f32` (kvllm's default
     arithmetic for the weight type) and llama-cpp-python with logits_all and f32 K/V (type_k = type_v = 0),
     so that neither side rounds its cache to f16 and the figure measures the model's math.
  4. bench/kldstats.py gives KL(P_llama.cpp || Q_kvllm) per position (nats), its mean, p99 and max, and the
     fraction of positions whose argmax agrees.  On random weights the distributions are broad (logits of
     standard deviation about 1 over 32,000 ids), where KLD is about half the variance of the logits'
     difference, so the table adds the sharper figure of test_families.py: the largest |logit difference|
     over the row's largest |logit|, maximum over positions.
The windows (128 positions, where the family has them) are crossed 8 times by 1,024 tokens; phi3's LongRoPE
takes its long factors on both sides (file context 4096 and llama.cpp's run context both over the original
256).  The bar of the KLD standard for random F16 / F32 files: mean KLD <= 1e-4 and top-1 >= 99 %.

Needs numpy and gguf (the test venv) for the files, and llama-cpp-python in the venv of
bench/build-llamacpp.sh (LLAMACPP_VENV, default /work/cache/llamacpp-venv), which runs as a child process.
Unless --no-reference, each file also runs through tests/python/ref_llama.py (numpy, f64, written from
Transformers' modeling code), so that a row off the bar says which engine is off.  Prints a markdown table
(family | file | tokens | tokenization identical | mean KLD, p99, max | top-1 | max relative logit difference,
kvllm against llama.cpp, then each against the reference); exits 1 when a row misses the bar.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "python"))

from gen_model import ModelConfig, tensor_specs, write_model  # noqa: E402
from kldstats import stats  # noqa: E402
from ref_llama import LlamaRef  # noqa: E402

VENV = Path(os.environ.get("LLAMACPP_VENV", "/work/cache/llamacpp-venv"))
DATA = Path(os.environ.get("KVLLM_SHARED", REPO / "tests" / "data"))
VOCABS = DATA / "tokenizers" / "llamacpp-vocab"
SPM_VOCAB = VOCABS / "ggml-vocab-llama-spm.gguf"
# llama.cpp's Phi-3 loader looks up Phi-3's own added tokens (<|end|>, ...): phi3 files carry that vocabulary
FAMILY_VOCAB = {"phi3": VOCABS / "ggml-vocab-phi-3.gguf"}
TEXT_CHARS = 16000          # of the text handed to the tokenizers: about 3,900 Llama 2 tokens of gpl-3.txt
KLD_BAR, TOP1_BAR = 1e-4, 0.99
WINDOW = 128

# Small shapes with each family's distinguishing features; n_vocab comes from the real vocabulary.
_common = dict(n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx=4096)
FAMILIES: dict[str, ModelConfig] = {
    "qwen3": ModelConfig(arch="qwen3", n_layer=2, key_length=64, rope_theta=1e6, norm_eps=1e-6, **_common),
    "qwen3moe": ModelConfig(arch="qwen3moe", n_layer=2, key_length=32, n_ff_exp=64, n_expert=8, n_expert_used=2,
                            rope_theta=1e6, norm_eps=1e-6, **_common),
    # even layers slide; the Gemma 2 configs' soft-caps
    "gemma2": ModelConfig(arch="gemma2", n_layer=4, key_length=32, n_swa=WINDOW, attn_softcap=50.0,
                          final_softcap=30.0, norm_eps=1e-6, tied=True, **_common),
    # layers 0-4 and 6 slide (base 10000), layer 5 is global (base 1e6, positions / 8)
    "gemma3": ModelConfig(arch="gemma3", n_layer=7, key_length=64, n_swa=WINDOW, rope_theta=1e6,
                          rope_scale_linear=8.0, norm_eps=1e-6, tied=True, **_common),
    # fused QKV and gate-up, rope on 24 of 32 dims, LongRoPE long factors (context 4096 over 256)
    "phi3": ModelConfig(arch="phi3", n_layer=2, n_rot=24, n_ctx_orig=256, longrope=True,
                        **{**_common, "n_head_kv": 4}),
    # layer 3 skips rope
    "smollm3": ModelConfig(arch="smollm3", n_layer=4, rope_theta=5e6, tied=True, **_common),
    # Mixtral as its converter writes it: llama with 8 experts, top-2
    "llama+experts": ModelConfig(arch="llama", n_layer=2, n_expert=8, n_expert_used=2, **{**_common, "n_ff": 64}),
    # sinks, Q/K/V/O and expert biases, even layers slide, YaRN factor 8 over 64
    "gpt-oss": ModelConfig(arch="gpt-oss", n_layer=4, key_length=64, n_ff_exp=64, n_expert=8, n_expert_used=4,
                           n_swa=WINDOW, rope_theta=150000.0, rope_yarn=(8.0, 64), **{**_common, "n_ff": 96}),
}

# Runs in llama.cpp's venv: tokenizes the text, evaluates the ids it is given, saves logits and what it made.
LLAMACPP_CHILD = r"""
import json, sys, numpy as np, llama_cpp
model, text_path, ids_path, out = sys.argv[1:5]
ids = json.load(open(ids_path))
text = open(text_path, encoding="utf-8").read()
m = llama_cpp.Llama(model_path=model, n_ctx=len(ids) + 64, n_batch=512, logits_all=True, verbose=False,
                    type_k=0, type_v=0)   # GGML_TYPE_F32 K/V
lc_ids = m.tokenize(text.encode("utf-8"), add_bos=True, special=False)
m.eval(ids)
np.save(out + ".npy", np.asarray(m.scores[:len(ids)], dtype=np.float32))
json.dump({"ids": lc_ids, "version": llama_cpp.__version__,
           "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()},
          open(out + ".json", "w"))
"""


def spm_vocab(path: Path) -> tuple[list[str], list[float], list[int]]:
    """tokens, scores and types of one of llama.cpp's SentencePiece vocabulary files."""
    r = gguf.GGUFReader(path)
    f = lambda k: r.get_field(k).contents()
    return f("tokenizer.ggml.tokens"), f("tokenizer.ggml.scores"), f("tokenizer.ggml.token_type")


def kvllm_tokenize(kvllm: str, model: Path, text: str) -> list[int]:
    out = subprocess.run([kvllm, "tokenize", "-m", str(model), "--ids", text], check=True,
                         capture_output=True, text=True).stdout
    return [int(t) for t in out.replace("[", " ").replace("]", " ").replace(",", " ").split()]


def kvllm_logits(kvllm: str, model: Path, ids: list[int], out: Path, threads: int) -> np.ndarray:
    subprocess.run([kvllm, "eval", "-m", str(model), "--tokens", " ".join(map(str, ids)), "-o", str(out),
                    "-t", str(threads), "--kv-type", "f32"], check=True, capture_output=True)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def llamacpp_run(model: Path, text: Path, ids: list[int], work: Path) -> tuple[np.ndarray, dict]:
    py = VENV / "bin" / "python"
    if not py.is_file():
        sys.exit(f"no llama.cpp venv at {VENV}: run bench/build-llamacpp.sh")
    ids_path, out = work / "ids.json", work / "llamacpp"
    ids_path.write_text(json.dumps(ids))
    p = subprocess.run([str(py), "-c", LLAMACPP_CHILD, str(model), str(text), str(ids_path), str(out)],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(f"llama.cpp on {model.name} failed:\n{p.stderr[-3000:]}")
    return np.load(str(out) + ".npy"), json.loads(Path(str(out) + ".json").read_text())


def describe(cfg: ModelConfig, n_params: int) -> str:
    feats = [f"{n_params / 1e6:.1f} M", cfg.dtype.upper(), f"{cfg.n_layer} layers",
             f"n_embd {cfg.n_embd}", f"heads {cfg.n_head}/{cfg.n_head_kv} of {cfg.head_dim}"]
    if cfg.n_expert:
        feats.append(f"{cfg.n_expert} experts top-{cfg.n_expert_used}")
    if cfg.n_swa:
        feats.append(f"window {cfg.n_swa}")
    return ", ".join(feats)


def rel_err(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per position: max |got - ref| over the row's max |ref| (test_families.py's measure)."""
    return np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)


def measure(a: argparse.Namespace, fam: str, cfg: ModelConfig, vocab, work: Path, text_file: Path) -> dict:
    """One file: write it, tokenize with both engines, teacher-force both, compare (and with the reference)."""
    model = work / f"{fam.replace('+', '-')}-{cfg.dtype}.gguf"
    write_model(model, cfg, seed=a.seed, vocab=vocab)
    kv_ids = kvllm_tokenize(a.kvllm, model, text_file.read_text(encoding="utf-8"))
    if len(kv_ids) < a.n_tokens:
        sys.exit(f"{a.text}: {len(kv_ids)} tokens, fewer than {a.n_tokens}")
    ids = kv_ids[:a.n_tokens]
    lc, info = llamacpp_run(model, text_file, ids, work)
    got = kvllm_logits(a.kvllm, model, ids, work / "kvllm.bin", a.threads)
    s = stats(lc, got)
    n_params = sum(int(np.prod(t.shape)) for t in tensor_specs(cfg))
    row = {"family": fam, "file": describe(cfg, n_params), "n_tokens": len(ids), "text_tokens": len(kv_ids),
           "tokens_equal": sum(x == y for x, y in zip(kv_ids, info["ids"])),
           "tokenization_identical": info["ids"] == kv_ids, **s, "max_rel_err": float(rel_err(got, lc).max()),
           "llama_cpp_python": info["version"], "system_info": info["system_info"]}
    row["meets_bar"] = s["kld_mean"] <= KLD_BAR and s["top1"] >= TOP1_BAR and row["tokenization_identical"]
    if not a.no_reference:
        ref = LlamaRef.from_gguf(model).forward(ids)
        for who, logits in (("kvllm", got), ("llama.cpp", lc)):
            row[f"{who}_vs_reference"] = {**stats(ref, logits), "max_rel_err": float(rel_err(logits, ref).max()),
                                          "median_rel_err": float(np.median(rel_err(logits, ref)))}
    return row


def table_row(r: dict) -> str:
    tok = f"yes ({r['text_tokens']} of {r['text_tokens']})" if r["tokenization_identical"] else \
        f"NO ({r['tokens_equal']} of {r['text_tokens']} equal)"
    cells = [r["family"], r["file"], str(r["n_tokens"]), tok, f"{r['kld_mean']:.2e}", f"{r['kld_p99']:.2e}",
             f"{r['kld_max']:.2e}", f"{100 * r['top1']:.2f} %" + ("" if r["meets_bar"] else " (misses the bar)"),
             f"{r['max_rel_err']:.1e}"]
    if "kvllm_vs_reference" in r:
        cells += [f"{r[w + '_vs_reference']['max_rel_err']:.1e}" for w in ("kvllm", "llama.cpp")]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/families-vs-llamacpp", help="where the files and logits go")
    ap.add_argument("--types", default="f32,f16")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--n-tokens", type=int, default=1024)
    ap.add_argument("--text", default=str(DATA / "text" / "gpl-3.txt"))
    ap.add_argument("--kvllm", default=str(REPO / "build" / "kvllm"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=24)
    ap.add_argument("--no-reference", action="store_true", help="skip the numpy f64 reference (seconds per file)")
    ap.add_argument("--json", help="write every row's figures here")
    a = ap.parse_args()

    work = Path(a.dir)
    work.mkdir(parents=True, exist_ok=True)
    text_file = work / "text.txt"
    text_file.write_text(Path(a.text).read_text(encoding="utf-8")[:TEXT_CHARS], encoding="utf-8")
    head = ["family", "file", "tokens", "tokenization identical", "mean KLD vs llama.cpp", "p99", "max", "top-1",
            "max rel. logit diff"]
    if not a.no_reference:
        head += ["kvllm vs f64 reference", "llama.cpp vs f64 reference"]
    print("| " + " | ".join(head) + " |")
    print("|---|---|---:|---|" + "---:|" * (len(head) - 4))
    rows = []
    for fam in a.families.split(","):
        vocab = spm_vocab(FAMILY_VOCAB.get(fam, SPM_VOCAB))
        for dtype in a.types.split(","):
            cfg = dataclasses.replace(FAMILIES[fam], dtype=dtype, n_vocab=len(vocab[0]), name=f"kvllm-random-{fam}")
            rows.append(measure(a, fam, cfg, vocab, work, text_file))
            print(table_row(rows[-1]), flush=True)
    if rows:
        print(f"\nllama-cpp-python {rows[0]['llama_cpp_python']}: {rows[0]['system_info']}")
    if a.json:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        Path(a.json).write_text(json.dumps({"rows": rows, "kvllm_commit": commit, "machine": platform.machine(),
                                            "text": Path(a.text).name, "date": time.strftime("%Y-%m-%d")},
                                           indent=1) + "\n")
    return 0 if all(r["meets_bar"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
