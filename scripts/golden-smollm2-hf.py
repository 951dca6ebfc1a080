#!/usr/bin/env python3
"""Golden data for tests/python/test_smollm2_hf.py: SmolLM2-135M-Instruct (Q4_1 GGUF) run by Hugging Face
Transformers on the CPU, in float32, on the same token ids kvllm feeds itself.

Transformers needs torch, which CI must never install, so this script is run by hand and its output is
committed (tests/golden/smollm2-hf/golden.json + logits.npz).  Its heavy dependencies are pinned in
scripts/requirements-heavy.txt; install them outside the repository, e.g.

    python3 -m venv /work/cache/heavy-venv
    /work/cache/heavy-venv/bin/pip install -r scripts/requirements-heavy.txt
    make   # build/kvllm renders the chat templates and tokenizes
    HF_HUB_OFFLINE=1 /work/cache/heavy-venv/bin/python scripts/golden-smollm2-hf.py

What it does, per prompt (half raw text, half chat conversations):
  * the prompt's token ids come from kvllm itself (`kvllm template -m GGUF` renders a conversation with the
    model's own chat template, `kvllm tokenize -m GGUF --ids` tokenizes), so the golden data compares the
    forward passes on identical input, never the tokenizers; Transformers' own tokenization (from the GGUF)
    is recorded beside it for information only;
  * Transformers loads the GGUF (it dequantizes every tensor to float32: dtype=torch.float32);
  * greedy decoding of N_GEN tokens: plain argmax of the last row, no sampling, no repetition penalty, and
    end-of-sequence ignored (decoding goes on past <|im_end|>; where it first appears is recorded);
  * one teacher-forced forward over prompt + generated ids: the argmax at every position, the top-1 minus
    top-2 logit margin at every position, and the full logit rows at two positions (the last prompt
    position and the last position) for the relative-error check.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_GGUF = REPO / "models" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT_DIR = REPO / "tests" / "golden" / "smollm2-hf"
N_GEN = 32

RAW_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
CHAT_PROMPTS = [
    # the model's default system prompt is added by its template
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a concise assistant. Answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Give me a word that rhymes with cat."},
     {"role": "assistant", "content": "Hat."},
     {"role": "user", "content": "And one that rhymes with dog? Also, what is 12 + 7?"}],
]


def sh(args: list[str], data: bytes | None = None) -> bytes:
    r = subprocess.run([str(a) for a in args], input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, args))}\n{r.stderr.decode(errors='replace')}")
    return r.stdout


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--kvllm", type=Path, default=REPO / "build" / "kvllm")
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import gguf as gguf_py

    torch.set_num_threads(a.threads)
    gg = a.gguf.resolve()
    print(f"loading {gg} with transformers {transformers.__version__}, torch {torch.__version__}", file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained(str(gg.parent), gguf_file=gg.name, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(gg.parent), gguf_file=gg.name)
    eos_id = int(sh([a.kvllm, "tokenize", "-m", gg, "--no-bos", "--parse-special", "--ids", "<|im_end|>"]).split()[0])

    prompts: list[tuple[str, object, str, list[int], list[int] | None]] = []
    for text in RAW_PROMPTS:
        ids = [int(t) for t in sh([a.kvllm, "tokenize", "-m", gg, "--ids", "-f", "-"], text.encode()).split()]
        hf_ids = tok(text, add_special_tokens=True)["input_ids"]
        prompts.append(("raw", text, text, ids, list(hf_ids)))
    for msgs in CHAT_PROMPTS:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(msgs, f)
        try:
            rendered = sh([a.kvllm, "template", "-m", gg, "--messages", f.name, "--add-generation-prompt"]).decode()
        finally:
            os.unlink(f.name)
        ids = [int(t) for t in sh([a.kvllm, "tokenize", "-m", gg, "--parse-special", "--ids", "-f", "-"],
                                  rendered.encode()).split()]
        try:
            hf_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if isinstance(hf_ids, dict) or hasattr(hf_ids, "keys"):
                hf_ids = hf_ids["input_ids"]
            hf_ids = [int(t) for t in hf_ids]
        except Exception as e:  # noqa: BLE001 - informational only
            print(f"transformers' chat template failed: {e}", file=sys.stderr)
            hf_ids = None
        prompts.append(("chat", msgs, rendered, ids, hf_ids))

    records = []
    arrays: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for k, (kind, source, text, ids, hf_ids) in enumerate(prompts):
            seq = list(ids)
            for _ in range(N_GEN):  # greedy, full recompute each step (small model): no cache subtleties
                logits = model(torch.tensor([seq], dtype=torch.long)).logits[0, -1]
                seq.append(int(torch.argmax(logits)))
            gen = seq[len(ids):]
            full = model(torch.tensor([seq], dtype=torch.long)).logits[0].float().numpy()
            argmax = full.argmax(axis=-1)
            top2 = np.sort(full, axis=-1)[:, -2:]
            margin = (top2[:, 1] - top2[:, 0]).astype(np.float32)
            # teacher-forced argmax at generated positions vs the incremental greedy tokens (should agree)
            tf_vs_greedy = int(sum(int(argmax[len(ids) - 1 + i]) == gen[i] for i in range(N_GEN)))
            positions = [len(ids) - 1, len(seq) - 1]
            arrays[f"p{k}_logits"] = full[positions].astype(np.float32)
            arrays[f"p{k}_margin"] = margin
            rec = {
                "kind": kind,
                "messages" if kind == "chat" else "text": source,
                "rendered": text,
                "ids": ids,
                "generated": gen,
                "eos_first_at": gen.index(eos_id) if eos_id in gen else None,
                "argmax": [int(x) for x in argmax],
                "logit_positions": positions,
                "teacher_forced_equals_greedy": tf_vs_greedy,
                "hf_tokenizer_ids_equal": (hf_ids == ids) if hf_ids is not None else None,
                "generated_text": tok.decode(gen),
            }
            if hf_ids is not None and hf_ids != ids:
                rec["hf_tokenizer_ids"] = hf_ids
            records.append(rec)
            print(f"prompt {k} ({kind}): {len(ids)} ids, eos at {rec['eos_first_at']}, tf==greedy "
                  f"{tf_vs_greedy}/{N_GEN}, hf tokenizer equal: {rec['hf_tokenizer_ids_equal']}, "
                  f"min margin at generated {float(margin[len(ids) - 1:-1].min()):.4f}\n  -> {rec['generated_text']!r}",
                  file=sys.stderr)

    a.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(a.out / "logits.npz", **arrays)
    meta = {
        "script": "scripts/golden-smollm2-hf.py",
        "model": gg.name,
        "gguf_sha256": sha256(gg),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "gguf": getattr(gguf_py, "__version__", "?"),
                     "numpy": np.__version__},
        "dtype": "float32 (transformers dequantizes the GGUF's Q4_1 tensors)",
        "n_gen": N_GEN,
        "eos_id": eos_id,
        "greedy": "argmax of the last row, full recompute per step, no sampling, no repetition penalty, "
                  "end-of-sequence ignored (eos_first_at records where it first appears)",
        "logits_file": "logits.npz: p<K>_logits = full rows at logit_positions (float32), "
                       "p<K>_margin = top-1 minus top-2 logit at every position (float32)",
        "prompts": records,
    }
    (a.out / "golden.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}/golden.json and logits.npz", file=sys.stderr)


if __name__ == "__main__":
    main()
