#!/usr/bin/env python3
"""Make tests/golden/quant/ggml-blocks.npz (read by tests/python/test_quant_types.py): llama.cpp's own C
quantizers and dequantizers (libggml-base from the venv of bench/build-llamacpp.sh, through ctypes) on
fixed inputs, for the block types gguf-py cannot encode or decode itself (MXFP4; the K and IQ4 encoders).

    bench/quant-goldens.py [OUT.npz]

Per type T (Q2_K Q3_K IQ4_NL IQ4_XS MXFP4): T/q, ggml_quantize_chunk(T) of the shared rows x (no
importance matrix: what llama-quantize writes); T/rnd, random blocks with finite scales; T/rnd_f32, their
decoding by ggml's to_float.  x: 8 rows of 512 normal values with awkward rows (zero, an outlier,
constant, tiny, one sign), stored.  Never part of CI; rerun after a llama.cpp upgrade.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("LLAMACPP_VENV", "/work/cache/llamacpp-venv"))

try:
    import llama_cpp  # noqa: F401
except ImportError:
    py = VENV / "bin" / "python"
    if py.exists() and Path(sys.executable) != py:
        os.execv(str(py), [str(py), *sys.argv])
    sys.exit(f"llama_cpp is not importable and {py} is missing: run bench/build-llamacpp.sh")

import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402

TYPES = {"Q2_K": 10, "Q3_K": 11, "IQ4_NL": 20, "IQ4_XS": 23, "MXFP4": 39}
# where each type's scales sit in its block (bytes), and how they are encoded, for random blocks
SCALES = {"Q2_K": [(80, "f16"), (82, "f16")], "Q3_K": [(108, "f16")], "IQ4_NL": [(0, "f16")],
          "IQ4_XS": [(0, "f16")], "MXFP4": [(0, "e8m0")]}


class Traits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


def ggml() -> ctypes.CDLL:
    libdir = Path(llama_cpp.__file__).parent / "lib"
    lib = ctypes.CDLL(str(next(iter(glob.glob(str(libdir / "libggml-base.so"))))))
    lib.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


def source_rows() -> np.ndarray:
    x = np.random.default_rng(2024).standard_normal((8, 512)).astype(np.float32)
    x[0] = 0
    x[1, 5] = 40.0
    x[2] = 0.75
    x[3] *= 1e-6
    x[4] = -np.abs(x[4])
    return x


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "golden" / "quant" / "ggml-blocks.npz"
    lib = ggml()
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
    x = source_rows()
    rows, cols = x.shape
    arrays = {"x": x}
    rng = np.random.default_rng(7)
    for name, t in TYPES.items():
        tr = lib.ggml_get_type_traits(t).contents
        nb, bs = cols // tr.blck_size, tr.type_size
        q = np.zeros((rows, nb * bs), np.uint8)
        lib.ggml_quantize_chunk(t, x.ctypes.data, q.ctypes.data, 0, rows, cols, None)
        rnd = rng.integers(0, 256, size=(rows, nb, bs), dtype=np.uint8)
        for off, kind in SCALES[name]:
            if kind == "f16":
                d = (rng.standard_normal((rows, nb)) * 0.01).astype(np.float16)
                rnd[:, :, off:off + 2] = d.view(np.uint8).reshape(rows, nb, 2)
            else:   # e8m0, subnormal results (0, 1) included, up to where 12 * 2^(e - 128) stays finite
                rnd[:, :, off] = rng.integers(0, 251, size=(rows, nb), dtype=np.uint8)
        rnd = np.ascontiguousarray(rnd.reshape(rows, nb * bs))
        y = np.zeros((rows, cols), np.float32)
        to_float_t(tr.to_float)(rnd.ctypes.data, y.ctypes.data, y.size)
        arrays[f"{name}/q"] = q
        arrays[f"{name}/rnd"] = rnd
        arrays[f"{name}/rnd_f32"] = y
    arrays["llama_cpp_python"] = np.array(llama_cpp.__version__)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(f"wrote {out} ({out.stat().st_size} bytes; llama-cpp-python {llama_cpp.__version__})")


if __name__ == "__main__":
    main()
