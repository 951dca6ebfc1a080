"""make_seeds.py — writes the seed corpora of the fuzz targets (corpus/<target>/seed-*).

    .venv/bin/python tests/fuzz/make_seeds.py build/kvllm

Seeds are small valid inputs, so libFuzzer starts from the parsers' accepting paths: a tiny llama
GGUF with a SentencePiece vocabulary and one with a byte-level BPE vocabulary; the Hugging Face
folder `kvllm convert --to hf` makes of the first (config.json, the separator line, model.safetensors);
its tokenizer.json and a hand-made byte-level one (a text to encode after the separator); the chat
templates of tests/data/templates with a conversation; OpenAI request bodies; raw HTTP/1.1 exchanges
for fuzz_http (every route, keep-alive and pipelined requests, chunked bodies, a stream, CORS
preflight, a bad key, headers cut short as a slowloris client leaves them).  Crash inputs found
later are kept beside the seeds under other names (crash-*), never rewritten by this script.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from gen_model import ModelConfig  # noqa: E402
from gguf_build import ARRAY, INT32, STRING, base_model, byte_unicode  # noqa: E402

SEP = b"\n--8<--\n"
CORPUS = HERE / "corpus"
SHARED = HERE.parent / "data"
TINY = ModelConfig(n_vocab=40, n_embd=8, n_layer=1, n_head=2, n_head_kv=1, n_ff=16, n_ctx=32, name="fuzz-tiny")


BYTES = byte_unicode()
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ w", "r e", "l l"]


def bpe_vocab() -> list[str]:
    v = list(BYTES)
    for m in MERGES:
        a, b = m.split(" ")
        v.append(a + b)
    return v + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def put(target: str, name: str, data: bytes) -> None:
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / f"seed-{name}").write_bytes(data)


def main(kvllm: str) -> int:
    # GGUF: SentencePiece-style llama vocabulary
    spm = base_model(TINY)
    put("gguf", "llama-spm.gguf", spm.render())
    # GGUF: byte-level BPE (model gpt2, merges, a named pre-tokenizer)
    bpe = base_model(TINY)
    toks = bpe_vocab()
    for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.tokens"):
        bpe.drop(k)
    bpe.set_str("tokenizer.ggml.model", "gpt2")
    bpe.set_str("tokenizer.ggml.pre", "gpt-2")
    bpe.set_array("tokenizer.ggml.tokens", STRING, toks)
    bpe.set_array("tokenizer.ggml.token_type", INT32, [1] * (len(toks) - 3) + [3, 3, 3])
    bpe.set_array("tokenizer.ggml.merges", STRING, MERGES)
    bpe.set_u32("tokenizer.ggml.bos_token_id", len(toks) - 3)
    bpe.set_u32("tokenizer.ggml.eos_token_id", len(toks) - 3)
    bpe.drop("tokenizer.ggml.unknown_token_id")
    put("gguf", "gpt2-bpe.gguf", bpe.render())

    with tempfile.TemporaryDirectory() as td:
        g = Path(td) / "tiny.gguf"
        g.write_bytes(spm.render())
        out = Path(td) / "hf"
        subprocess.run([kvllm, "convert", str(g), "--to", "hf", "-o", str(out)], check=True,
                       stderr=subprocess.DEVNULL)
        put("hf", "llama", (out / "config.json").read_bytes() + SEP + (out / "model.safetensors").read_bytes())
        put("tokenizer_json", "spm", (out / "tokenizer.json").read_bytes() + SEP + b"Hello world, a b c")

    tj = {
        "version": "1.0",
        "added_tokens": [{"id": len(BYTES) + len(MERGES) + i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, t in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {t: i for i, t in enumerate(bpe_vocab()[:-3])}, "merges": MERGES},
    }
    put("tokenizer_json", "byte-level",
        json.dumps(tj, ensure_ascii=False).encode() + SEP + "<|im_start|>the weather in Zürich 42\n".encode())

    conv = json.dumps([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                       {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]).encode()
    for t in sorted((SHARED / "templates").glob("*.jinja")):
        put("jinja", t.stem, t.read_bytes() + SEP + conv)
    put("jinja", "loops", b"{% for m in messages %}{{ loop.index }}:{{ m.role|upper }}={{ m.content|trim|tojson }}"
        b"{% if not loop.last %}, {% endif %}{% endfor %}{% set ns = namespace(x=0) %}{{ ns.x + 1 }}"
        b"{{ 'a,b'.split(',')|join('-') }}{{ [3,1,2]|sort|list }}{{ {'k': 1}.items()|list }}"
        + SEP + conv)

    bodies = {
        "chat": (1, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0,
                     "stream": True, "stream_options": {"include_usage": True}, "n": 2, "stop": ["\n"]}),
        "completion": (0, {"prompt": "Once upon a time", "max_tokens": 16, "top_p": 0.9, "seed": 7,
                           "logprobs": 2, "presence_penalty": 0.5, "frequency_penalty": 0.1}),
        "completion-ids": (0, {"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 4, "stop": "x", "echo": False}),
        "chat-null": (1, {"model": "m", "messages": [{"role": "system", "content": None},
                                                      {"role": "user", "content": [{"type": "text", "text": "a"}]}],
                          "logprobs": True, "top_logprobs": 3}),
    }
    for name, (chat, body) in bodies.items():
        put("openai", name, bytes([chat]) + json.dumps(body).encode())
    http_seeds()
    return 0


def http_request(method: str, path: str, body: bytes | None = None, key: str | None = "k",
                 extra: str = "", chunked: bool = False) -> bytes:
    """One HTTP/1.1 request as fuzz_http's server expects it (API key "k")."""
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    head += extra
    if body is None:
        return (head + "\r\n").encode()
    head += "Content-Type: application/json\r\n"
    if not chunked:
        return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    out = (head + "Transfer-Encoding: chunked\r\n\r\n").encode()
    for i in range(0, len(body), 7):
        part = body[i:i + 7]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


def http_seeds() -> None:
    chat = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}).encode()
    stream = json.dumps({"prompt": "Once upon a time", "max_tokens": 5, "stream": True, "n": 2,
                         "stream_options": {"include_usage": True}}).encode()
    comp = json.dumps({"prompt": ["Once", "Lily"], "max_tokens": 3, "stop": ["."], "logprobs": 1}).encode()
    seeds = {
        "get-all": b"".join(http_request("GET", p) for p in
                            ["/health", "/v1/models", "/v1/models/stories260K", "/version", "/props", "/metrics"]),
        "chat": http_request("POST", "/v1/chat/completions", chat, extra="Connection: close\r\n"),
        "stream": http_request("POST", "/v1/completions", stream),
        "completions-chunked": http_request("POST", "/v1/completions", comp, chunked=True),
        "llama-tokenize": http_request("POST", "/tokenize", b'{"content": "Once upon a time"}')
        + http_request("POST", "/detokenize", b'{"tokens": [1, 2, 3]}')
        + http_request("POST", "/completion", b'{"prompt": "Lily", "n_predict": 3}'),
        "cors-preflight": http_request("OPTIONS", "/v1/chat/completions", key=None,
                                       extra="Origin: http://a.example\r\nAccess-Control-Request-Method: POST\r\n"),
        "bad-key": http_request("POST", "/v1/completions", comp, key="wrong"),
        "slowloris": b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\nX-a: ",
        "short-body": http_request("POST", "/v1/completions", comp)[:-10],
        "http10-head": b"HEAD /health HTTP/1.0\r\n\r\nGET /v1/models HTTP/1.0\r\nAuthorization: Bearer k\r\n\r\n",
        "expect-continue": http_request("POST", "/v1/completions", comp, extra="Expect: 100-continue\r\n"),
    }
    for name, data in seeds.items():
        put("http", name, data)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/kvllm"))
