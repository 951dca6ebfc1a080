"""tp_model.py — a GGUF rewritten so that its attention heads split over N tensor-parallel ranks, computing the
same function as the original.

kvllm splits whole heads evenly over the ranks (docs/TP.md): SmolLM2-135M (9 query heads over 3 KV heads) and
Gemma 3 270M (4 over 1) cannot run under `mpirun -np 2`.  The suites that check answers of those models
(test_tools.py, test_constrained.py, test_spec.py under KVLLM_TEST_MPI_NP) serve this file instead:

- KV heads are replicated (each query head still reads a copy of the KV head it read), which changes nothing
  but the KV cache's size;
- when the query heads do not divide by N, every query head gets its own KV head (multi-head attention, the
  same function again) and heads are added until they do: a padding head's query rows and its columns of
  attn_output are zeros, so it adds exact zeros to the output projection.

Rows of a quantized tensor are independent (whole blocks), so heads are copied as bytes; padded columns of
attn_output are whole zero blocks, which every GGUF block type reads as 0.  The tokenizer, chat template and
every other tensor are copied as they are.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np


def _plan(n_head: int, n_head_kv: int, n: int) -> tuple[int, int]:
    """(query heads, KV heads) of the rewritten file."""
    if n_head % n == 0:
        for k in range(n_head_kv, n_head + 1, n_head_kv):   # multiples of n_head_kv that divide n_head
            if n_head % k == 0 and k % n == 0:
                return n_head, k
    h = math.ceil(n_head / n) * n
    return h, h


def _rows(data: np.ndarray, heads: int) -> np.ndarray:
    """A tensor's rows (the output dimension) grouped by head: (heads, rows per head, row bytes or values)."""
    a = data.reshape(data.shape[0], -1) if data.ndim > 1 else data.reshape(-1, 1)
    return a.reshape(heads, a.shape[0] // heads, a.shape[1])


def _kv_map(n_head: int, n_head_kv: int, h2: int, k2: int) -> list[int]:
    """For each KV head of the rewritten file, the original KV head it copies: the one its query heads read."""
    g, g2 = n_head // n_head_kv, h2 // k2
    return [min(j * g2, n_head - 1) // g if j * g2 < n_head else 0 for j in range(k2)]


def rewrite(src: Path, dst: Path, n: int) -> None:
    import gguf   # noqa: PLC0415  (the test venv's; only this helper needs it)
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    key = lambda k: f"{arch}.{k}"   # noqa: E731
    n_embd = int(r.fields[key("embedding_length")].contents())
    n_head = int(r.fields[key("attention.head_count")].contents())
    n_head_kv = int(r.fields[key("attention.head_count_kv")].contents())
    k_len = int(r.fields[key("attention.key_length")].contents()) if key("attention.key_length") in r.fields \
        else n_embd // n_head
    v_len = int(r.fields[key("attention.value_length")].contents()) if key("attention.value_length") in r.fields \
        else k_len
    h2, k2 = _plan(n_head, n_head_kv, n)
    kv_src = _kv_map(n_head, n_head_kv, h2, k2)
    w = gguf.GGUFWriter(dst, arch)
    set_here = {key("attention.head_count"): h2, key("attention.head_count_kv"): k2,
                key("attention.key_length"): k_len, key("attention.value_length"): v_len}
    if key("rope.dimension_count") not in r.fields:
        set_here[key("rope.dimension_count")] = k_len
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in set_here:
            continue
        t = f.types[0]
        w.add_key_value(f.name, f.contents(), t, sub_type=f.types[-1] if t == gguf.GGUFValueType.ARRAY else None)
    for k, v in set_here.items():
        w.add_uint32(k, v)
    out = []
    for t in r.tensors:
        data = np.asarray(t.data)
        base = t.name.rsplit(".", 2)
        kind = base[1] if len(base) == 3 and t.name.startswith("blk.") else ""
        if kind == "attn_q":
            rows = _rows(data, n_head)
            pad = np.zeros((h2 - n_head, *rows.shape[1:]), rows.dtype)
            data = np.concatenate([rows, pad]).reshape(-1, *data.shape[1:]) if data.ndim > 1 else \
                np.concatenate([rows, pad]).reshape(-1)
        elif kind in ("attn_k", "attn_v"):
            rows = _rows(data, n_head_kv)[kv_src]
            data = rows.reshape(-1, *data.shape[1:]) if data.ndim > 1 else rows.reshape(-1)
        elif kind == "attn_output" and h2 > n_head and base[2] == "weight":
            # columns of the padding heads: whole zero blocks appended to every row
            bs, ts = gguf.GGML_QUANT_SIZES[t.tensor_type]
            cols = (h2 - n_head) * v_len
            assert cols % bs == 0, f"{t.name}: {cols} padded columns are not whole {t.tensor_type.name} blocks"
            per = cols // bs * ts if data.dtype == np.uint8 else cols
            data = np.concatenate([data, np.zeros((data.shape[0], per), data.dtype)], axis=1)
        out.append((t, np.ascontiguousarray(data)))
    for t, data in out:
        w.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, data in out:
        w.write_tensor_data(data)
    w.close()


# Bumped when rewrite() changes, so that files written by an older one are not reused.
FORMAT = 1


def splittable(src: Path, n: int, cache: Path) -> Path:
    """src rewritten for n ranks (rewrite), kept as cache/tp<n>.v<FORMAT>/<src's name> (the name a server's model
    id comes from) and reused while newer than src; src itself when n is 1."""
    if n == 1:
        return src
    cache = cache / f"tp{n}.v{FORMAT}"
    dst = cache / src.name
    if not dst.is_file() or dst.stat().st_mtime < src.stat().st_mtime:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f"{src.name}.{os.getpid()}.tmp"
        rewrite(src, tmp, n)
        tmp.replace(dst)
    return dst
