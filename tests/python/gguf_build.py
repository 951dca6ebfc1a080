"""gguf_build.py — a minimal GGUF v3 writer with byte-level control, for corrupt-file tests.

Unlike gguf.GGUFWriter it will happily write anything: wrong magic or version, counts that lie,
empty arrays, absurd lengths, unknown type ids, offsets past the end.

    g = base_model()            # a small valid llama model (kvs + tensor infos + data)
    g.set_u64("llama.embedding_length", 2**40)
    g.tensor("token_embd.weight")["offset"] = 2**40
    path.write_bytes(g.render())
"""
from __future__ import annotations

import copy
import struct
from dataclasses import dataclass, field

import numpy as np

from gen_model import ModelConfig, make_vocab, random_tensors

# GGUF value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
# ggml tensor types
GGML_F32, GGML_F16 = 0, 1

_SCALAR = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f",
           BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


def gstr(s: str | bytes, length: int | None = None) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b) if length is None else length) + b


def value(vtype: int, v) -> bytes:
    if vtype == STRING:
        return gstr(v)
    return struct.pack(_SCALAR[vtype], v)


def array(sub: int, items, count: int | None = None) -> bytes:
    """Payload of an ARRAY value (without the ARRAY type tag)."""
    out = struct.pack("<IQ", sub, len(items) if count is None else count)
    return out + b"".join(value(sub, x) for x in items)


def byte_unicode() -> list[str]:
    """GPT-2's bytes_to_unicode: the 256 printable stand-ins of the byte-level vocabularies, by byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


@dataclass
class GGUF:
    kvs: list[tuple[str, bytes]] = field(default_factory=list)     # (key, full encoded entry)
    tis: list[dict] = field(default_factory=list)                   # {name, ne (GGUF order), type, offset}
    data: bytes = b""
    magic: bytes = b"GGUF"
    version: int = 3
    n_tensors: int | None = None     # None: len(tis)
    n_kv: int | None = None          # None: len(kvs)
    align: int = 32
    # filled by render(): where each section starts in the output
    kv_start: int = 0
    ti_start: int = 0
    data_start: int = 0

    def copy(self) -> "GGUF":
        return copy.deepcopy(self)

    # ---- metadata edits ----
    def _entry(self, key: str, vtype: int, payload: bytes) -> tuple[str, bytes]:
        return (key, gstr(key) + struct.pack("<I", vtype) + payload)

    def set(self, key: str, vtype: int, payload: bytes) -> "GGUF":
        """Set key to an already-encoded payload of type vtype (replacing it in place if present)."""
        e = self._entry(key, vtype, payload)
        for i, (k, _) in enumerate(self.kvs):
            if k == key:
                self.kvs[i] = e
                return self
        self.kvs.append(e)
        return self

    def set_u32(self, key, v): return self.set(key, UINT32, value(UINT32, v))
    def set_u64(self, key, v): return self.set(key, UINT64, value(UINT64, v))
    def set_f32(self, key, v): return self.set(key, FLOAT32, value(FLOAT32, v))
    def set_str(self, key, v): return self.set(key, STRING, gstr(v))
    def set_bool(self, key, v): return self.set(key, BOOL, value(BOOL, v))
    def set_array(self, key, sub, items, count=None): return self.set(key, ARRAY, array(sub, items, count))

    def drop(self, key: str) -> "GGUF":
        n = len(self.kvs)
        self.kvs = [(k, e) for k, e in self.kvs if k != key]
        assert len(self.kvs) == n - 1, f"no key {key}"
        return self

    def raw_kv(self, entry: bytes) -> "GGUF":
        """Append an arbitrary pre-encoded kv entry (bytes of key + type + value)."""
        self.kvs.append(("<raw>", entry))
        return self

    # ---- tensor edits ----
    def tensor(self, name: str) -> dict:
        return next(t for t in self.tis if t["name"] == name)

    def drop_tensor(self, name: str) -> "GGUF":
        self.tis = [t for t in self.tis if t["name"] != name]
        return self

    def render(self) -> bytes:
        out = bytearray()
        out += self.magic
        out += struct.pack("<I", self.version)
        out += struct.pack("<QQ", len(self.tis) if self.n_tensors is None else self.n_tensors,
                           len(self.kvs) if self.n_kv is None else self.n_kv)
        self.kv_start = len(out)
        for _, e in self.kvs:
            out += e
        self.ti_start = len(out)
        for t in self.tis:
            out += gstr(t["name"])
            out += struct.pack("<I", len(t["ne"]))
            for n in t["ne"]:
                out += struct.pack("<Q", n)
            out += struct.pack("<IQ", t["type"], t["offset"])
        pad = (-len(out)) % self.align
        out += b"\0" * pad
        self.data_start = len(out)
        out += self.data
        return bytes(out)

    def kv_span(self, key: str) -> tuple[int, int]:
        """(start, end) of a key's entry in the last render()."""
        off = self.kv_start
        for k, e in self.kvs:
            if k == key:
                return off, off + len(e)
            off += len(e)
        raise KeyError(key)


BASE_CFG = ModelConfig(n_vocab=270, n_embd=16, n_layer=1, n_head=2, n_head_kv=1, n_ff=32, n_ctx=64,
                       name="bad-input-base")


def base_model(cfg: ModelConfig = BASE_CFG, seed: int = 0) -> GGUF:
    """A small, valid llama GGUF (F32 tensors, SentencePiece-style vocab)."""
    g = GGUF()
    g.set_str("general.architecture", "llama")
    g.set_str("general.name", cfg.name)
    g.set_u32("llama.context_length", cfg.n_ctx)
    g.set_u32("llama.embedding_length", cfg.n_embd)
    g.set_u32("llama.block_count", cfg.n_layer)
    g.set_u32("llama.feed_forward_length", cfg.n_ff)
    g.set_u32("llama.attention.head_count", cfg.n_head)
    g.set_u32("llama.attention.head_count_kv", cfg.n_head_kv)
    g.set_u32("llama.rope.dimension_count", cfg.rot)
    g.set_f32("llama.rope.freq_base", cfg.rope_theta)
    g.set_f32("llama.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    tokens, scores, types = make_vocab(cfg.n_vocab)
    g.set_str("tokenizer.ggml.model", "llama")
    g.set_array("tokenizer.ggml.tokens", STRING, tokens)
    g.set_array("tokenizer.ggml.scores", FLOAT32, scores)
    g.set_array("tokenizer.ggml.token_type", INT32, types)
    g.set_u32("tokenizer.ggml.bos_token_id", 1)
    g.set_u32("tokenizer.ggml.eos_token_id", 2)
    g.set_u32("tokenizer.ggml.unknown_token_id", 0)
    data = bytearray()
    for spec, arr in random_tensors(cfg, seed):
        a = np.ascontiguousarray(arr.astype(np.float32))
        data += b"\0" * ((-len(data)) % g.align)
        g.tis.append({"name": spec.name, "ne": list(reversed(a.shape)), "type": GGML_F32, "offset": len(data)})
        data += a.tobytes()
    g.data = bytes(data)
    return g
