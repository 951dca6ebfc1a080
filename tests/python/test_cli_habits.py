"""What llama.cpp and vLLM users type, through the kvllm binary: run's -f, -p -, -n -1,
--parse-special (on by default for special-token text), -sys, --color, --version, GPU-only flags,
"did you mean"; chat's Ctrl-C, context overflow, slash commands; info, tokenize, quantize and bench
output; every command's --help.  stories260K for speed where the model does not matter, SmolLM2 where
the tokenizer or chat template does."""
from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import select
import signal
import time

import pytest

from kvtest import parse_ids

IM = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def st(stories) -> list:
    return ["-m", stories["bin"], "--tokenizer", stories["tok"]]


def prompt_ids(err: str) -> list[int]:
    m = re.search(r"prompt ids \(\d+\):([ \d]*)", err)
    assert m, err
    return [int(x) for x in m.group(1).split()]


# ---- run --------------------------------------------------------------------------------------

def test_run_special_text_as_tokenize_parse_special(run, smollm2, f32_answers):
    """llama-cli reads <|im_start|> in a prompt as the control token: so does run, by default."""
    tok = run("tokenize", "-m", smollm2, "--parse-special", "--ids", IM).check_ok()
    want = parse_ids(tok.out)
    assert len(want) < 20, tok.describe()
    res = run("run", "-m", smollm2, "-p", IM, "-n", "12", "--temp", "0", "--verbose-prompt").check_ok()
    assert prompt_ids(res.err) == want, res.describe()
    assert "special-token text" in res.err
    assert "Paris" in res.out, res.describe()
    # --no-parse-special: the old behaviour, the text split into many pieces
    res = run("run", "-m", smollm2, "-p", IM, "-n", "1", "--temp", "0", "--verbose-prompt",
              "--no-parse-special").check_ok()
    assert len(prompt_ids(res.err)) > len(want) + 10, res.describe()


def test_run_system_prompt_uses_template(run, smollm2, f32_answers):
    tmpl = run("tokenize", "-m", smollm2, "--parse-special", "--ids",
               "<|im_start|>system\nYou are terse.<|im_end|>\n" + IM).check_ok()
    res = run("run", "-m", smollm2, "-sys", "You are terse.", "-p", "What is the capital of France?",
              "-n", "16", "--temp", "0", "--verbose-prompt").check_ok()
    assert prompt_ids(res.err) == parse_ids(tmpl.out), res.describe()
    assert "Paris" in res.out and "What is the capital" not in res.out, res.describe()
    res = run("run", "-m", smollm2, "--system-prompt", "You are terse.", "-p", "What is the capital of France?",
              "-n", "16", "--temp", "0", "-q").check_ok()
    assert "Paris" in res.out


def test_run_prompt_from_file_and_stdin(run, st, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_text("Once upon a time")
    a = run("run", *st, "-p", "Once upon a time", "-n", "16", "--temp", "0", "-q").check_ok()
    b = run("run", *st, "-f", f, "-n", "16", "--temp", "0", "-q").check_ok()
    c = run("run", *st, "-p", "-", "-n", "16", "--temp", "0", "-q", stdin=b"Once upon a time").check_ok()
    d = run("run", *st, "--file", "-", "-n", "16", "--temp", "0", "-q", stdin=b"Once upon a time").check_ok()
    assert a.out == b.out == c.out == d.out and a.out.startswith("Once upon a time"), (a.out, b.out, c.out, d.out)
    bad = run("run", *st, "-f", tmp_path / "missing.txt", "-q")
    assert bad.returncode == 1 and "missing.txt" in bad.err


def test_run_n_minus_one_until_context(run, st):
    res = run("run", *st, "-p", "Once", "-n", "-1", "-c", "48", "--temp", "0", "--ignore-eos", "--ids").check_ok()
    n_prompt = int(re.search(r"prompt (\d+) tokens", res.err).group(1))
    assert len(parse_ids(res.out)) == 48 - n_prompt, res.describe()


def test_run_color_marks_the_prompt(run, st):
    res = run("run", *st, "-p", "Once upon a time", "-n", "4", "--temp", "0", "-q", "--color").check_ok()
    assert res.out.startswith("\x1b[33mOnce upon a time\x1b[0m"), repr(res.out)
    plain = run("run", *st, "-p", "Once upon a time", "-n", "4", "--temp", "0", "-q", "--color", "auto").check_ok()
    assert "\x1b[" not in plain.out   # stdout is a pipe


@pytest.mark.parametrize("cmd", [[], ["run"], ["serve"], ["chat"]])
def test_version(run, cmd):
    res = run(*cmd, "--version").check_ok()
    assert re.match(r"kvllm \d+\.\d+\.\d+ \(commit [0-9a-f]{4,}|kvllm \d+\.\d+\.\d+ \(commit unknown", res.out), res.out
    assert "kernels: scalar" in res.out
    # what the build has: the kernel sets compiled in and runnable here, and whether CUDA is built
    sets = r"scalar(, avx2(, avx512(, amx)?)?)?"
    assert re.search(rf"^kernels: {sets} \(this CPU: {sets}; default (scalar|avx2|avx512|amx)\)$", res.out, re.M), res.out
    assert re.search(r"^GPU: (none \(CPU-only build|CUDA backend built)", res.out, re.M), res.out


def test_gpu_flags_accepted_with_a_note(run, st):
    res = run("run", *st, "-p", "Once", "-n", "4", "--temp", "0", "-ngl", "99", "-fa", "on",
              "--n-gpu-layers=33", "-no-cnv").check_ok()
    notes = [l for l in res.err.splitlines() if "note:" in l]
    assert len(notes) == 3 and "-ngl 99 ignored" in notes[0] and "GPU" in notes[0], res.err


def test_backend_chosen_by_environment_and_flags(run, st):
    """The library reads no environment variable: the CLI turns KVLLM_BACKEND, KVLLM_CPU, KVLLM_ACT and the
    device flags (llama.cpp's -dev / -mg, vLLM's --device) into the model's parameters; a flag wins over the
    variable, and a choice the library refuses names the field, the valid choices and what set it."""
    gen = ("run", *st, "-p", "Once", "-n", "2", "--temp", "0")
    res = run(*gen, env={"KVLLM_BACKEND": "strict", "KVLLM_CPU": "scalar"}).check_ok()
    assert "kernels strict/scalar" in res.err, res.describe()
    res = run(*gen, "-dev", "none", env={"KVLLM_BACKEND": "strict", "KVLLM_CPU": "scalar"}).check_ok()
    assert "kernels scalar" in res.err, res.describe()
    for var, valid in (("KVLLM_BACKEND", "valid: cpu, strict, cuda"), ("KVLLM_ACT", "valid: q8, f32, int"),
                       ("KVLLM_CPU", "valid: scalar, avx2, avx512, amx")):
        res = run(*gen, env={var: "bogus"})
        assert res.returncode == 1 and f"{var}=bogus" in res.err and valid in res.err, res.describe()
    res = run(*gen, env={"KVLLM_CUDA_DEVICE": "first"})
    assert res.returncode == 1 and "KVLLM_CUDA_DEVICE=first" in res.err, res.describe()
    for flags, want in ((("-dev", "CUDA0,CUDA1"), "one device"), (("--device", "tpu"), "valid: none or cpu"),
                        (("-mg", "x"), "a GPU's index")):
        res = run(*gen, *flags)
        assert res.returncode == 2 and want in res.err, res.describe()
    res = run(*gen, "-mg", "1").check_ok()
    assert "-mg 1 ignored: the model runs on the CPU" in res.err, res.describe()
    if "CUDA backend built" not in run("--version").check_ok().out:
        res = run(*gen, "-dev", "cuda:1")
        assert res.returncode == 1 and "no CUDA backend" in res.err and "-dev cuda:1" in res.err, res.describe()


@pytest.mark.parametrize("cmd,typo,want", [("run", "--tmep", "--temp"), ("run", "--top_k", "--top-k"),
                                           ("serve", "--prot", "--port"), ("chat", "--sytem", "--system"),
                                           ("bench", "--rpes", "--reps")])
def test_unknown_flag_names_the_closest(run, st, cmd, typo, want):
    args = [cmd] + (["model", "-m", st[1]] if cmd == "bench" else st) + [typo, "1"]
    res = run(*args)
    assert res.returncode == 2, res.describe()
    assert f"did you mean {want}?" in res.err, res.err


# ---- bench ------------------------------------------------------------------------------------

def test_bench_llama_bench_aliases_and_formats(run, stories):
    args = ["bench", "model", "-m", stories["bin"], "-p", "16", "-n", "8", "-r", "2", "-t", "1", "-d", "0,8", "-b", "8"]
    md = run(*args).check_ok()
    head = md.out.splitlines()[0]
    for col in ("model", "size", "params", "backend", "tokens/s"):
        assert col in head, md.out
    rows = [l for l in md.out.splitlines()[2:] if l.startswith("|")]
    assert len(rows) == 4 and all(len(r) == len(head) for r in rows), md.out   # columns line up
    js = json.loads(run(*args, "-o", "json").check_ok().out)
    assert isinstance(js, list) and len(js) == 4, js
    assert {r["test"] for r in js} == {"pp16", "tg8"} and {r["depth"] for r in js} == {0, 8}
    assert all(r["size_bytes"] > 0 and r["params"] > 200000 and r["backend"] for r in js)
    jl = [json.loads(l) for l in run(*args, "-o", "jsonl").check_ok().out.splitlines()]
    assert len(jl) == 4 and jl[0].keys() == js[0].keys()
    cs = list(csv.DictReader(io.StringIO(run(*args, "-o", "csv").check_ok().out)))
    assert len(cs) == 4 and cs[0]["model"] == "stories260K.bin" and float(cs[0]["tokens_per_s_median"]) > 0


LLAMA_BENCH_KEYS = {  # tools/llama-bench's JSON rows (the GPU and CPU-affinity ones left out)
    "build_commit": str, "build_number": int, "cpu_info": str, "gpu_info": str, "backends": str,
    "model_filename": str, "model_type": str, "model_size": int, "model_n_params": int, "n_batch": int,
    "n_ubatch": int, "n_threads": int, "type_k": str, "type_v": str, "n_gpu_layers": int, "flash_attn": bool,
    "use_mmap": bool, "embeddings": bool, "n_prompt": int, "n_gen": int, "n_depth": int, "test_time": str,
    "avg_ns": (int, float), "stddev_ns": (int, float), "avg_ts": float, "stddev_ts": float,
    "samples_ns": list, "samples_ts": list}


def test_bench_json_has_llama_bench_keys(run, stories):
    """A reader of llama-bench's JSON reads kvllm's: its keys, typed as llama-bench writes them, whose values agree
    with kvllm's own (avg_ts is the mean of samples_ts; tokens/s = n / seconds of each sample)."""
    for fmt in ("json", "jsonl"):
        out = run("bench", "model", "-m", stories["bin"], "-p", "16", "-n", "8", "-r", "3", "-t", "1", "-d", "0,4",
                  "-o", fmt).check_ok().out
        rows = json.loads(out) if fmt == "json" else [json.loads(l) for l in out.splitlines()]
        assert len(rows) == 4
        for r in rows:
            for k, t in LLAMA_BENCH_KEYS.items():
                assert isinstance(r.get(k), t), (k, r)
            assert r["model_filename"] == str(stories["bin"]) and r["model_type"].startswith("llama ")
            assert (r["n_prompt"], r["n_gen"], r["n_depth"], r["n_threads"]) == (r["pp"], r["tg"], r["depth"], 1)
            assert r["model_size"] == r["size_bytes"] and r["model_n_params"] == r["params"]
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])
            assert len(r["samples_ts"]) == len(r["samples_ns"]) == 3
            n = r["n_prompt"] or r["n_gen"]
            for ts, ns in zip(r["samples_ts"], r["samples_ns"]):
                assert abs(ts - n * 1e9 / ns) <= 1e-3 * ts, r
            assert abs(r["avg_ts"] - sum(r["samples_ts"]) / 3) <= 1e-3 * r["avg_ts"], r
            assert min(r["samples_ts"]) <= r["tokens_per_s_median"] <= max(r["samples_ts"]), r


def svg_series(path) -> dict[str, int]:
    """The series of an SVG chart kvllm wrote (it must parse as XML): name -> number of marks (points or bars)."""
    import xml.etree.ElementTree as ET
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.parse(path).getroot()
    assert root.tag == ns + "svg"
    return {g.get("data-name"): len(g.findall(ns + "circle")) + len(g.findall(ns + "rect"))
            for g in root.iter(ns + "g") if g.get("class") == "series"}


def test_bench_svg_plots(run, stories, tmp_path):
    """--svg DIR draws the rows: decode tokens/s against --batch and against --depth, and kvllm beside the engine
    --compare names (llama-bench's JSON); `bench plot` draws rows measured before (bench/vs-llamacpp's JSON)."""
    lb = tmp_path / "llama-bench.json"
    lb.write_text(json.dumps([{"model_filename": "/m/stories260K.bin", "n_prompt": 16, "n_gen": 0, "n_depth": d,
                               "n_threads": 1, "avg_ts": 1000.0} for d in (0, 8)] +
                             [{"model_filename": "/m/stories260K.bin", "n_prompt": 0, "n_gen": 8, "n_depth": d,
                               "n_threads": 1, "avg_ts": 500.0 + d} for d in (0, 8)]))
    out = tmp_path / "svg"
    res = run("bench", "model", "-m", stories["bin"], "-p", "16", "-n", "8", "-r", "1", "-t", "1", "-d", "0,8",
              "--batch", "1,2", "--svg", out, "--compare", lb, "--compare-label", "llama.cpp <b1>").check_ok()
    assert sorted(p.name for p in out.iterdir()) == ["batch.svg", "compare.svg", "depth.svg"], res.err
    assert svg_series(out / "batch.svg") == {"kvllm d=0": 2, "kvllm d=8": 2}
    assert svg_series(out / "depth.svg") == {"kvllm": 2, "llama.cpp <b1>": 2}
    # the tests both engines ran: pp16 and tg8 (batch 1) at both depths
    assert svg_series(out / "compare.svg") == {"kvllm": 4, "llama.cpp <b1>": 4}
    # bench/vs-llamacpp -o json: both engines in one file
    vs = tmp_path / "vs.json"
    vs.write_text(json.dumps({"meta": {}, "rows": [
        {"model": "m.gguf", "threads": 2, "pp": 0, "tg": 64, "depth": 0, "batch": b,
         "llamacpp_tokens_per_s_median": 10.0 * b, "kvllm_tokens_per_s_median": 12.0 * b} for b in (1, 4, 16)]}))
    out2 = tmp_path / "svg2"
    run("bench", "plot", "--svg", out2, vs).check_ok()
    assert svg_series(out2 / "batch.svg") == {"kvllm": 3, "llama.cpp": 3}
    assert svg_series(out2 / "compare.svg") == {"kvllm": 3, "llama.cpp": 3}
    assert not (out2 / "depth.svg").exists()
    bad = tmp_path / "bad.json"
    bad.write_text('[{"model": "x"}]')
    res = run("bench", "plot", "--svg", out2, bad)
    assert res.returncode == 1 and "bad.json" in res.err and "row 1" in res.err, res.describe()
    res = run("bench", "model", "-m", stories["bin"], "-r", "1", "--svg", out, "--compare", bad)
    assert res.returncode == 1 and "bad.json" in res.err and not res.out, res.describe()


def test_bench_lists_one_row_per_combination(run, stories):
    """llama-bench's lists: -p, -n, -t and -b take comma lists, one row per combination, nested as
    llama-bench nests them (threads, batch size, depth, then each -p and each -n), in every format."""
    args = ["bench", "model", "-m", stories["bin"], "-p", "8,16", "-n", "4,6", "-t", "1,2", "-b", "4,8", "-r", "1"]
    want = [(t, b, test) for t in (1, 2) for b in (4, 8) for test in ("pp8", "pp16", "tg4", "tg6")]
    js = json.loads(run(*args, "-o", "json").check_ok().out)
    assert [(r["threads"], r["n_batch"], r["test"]) for r in js] == want, js
    assert all((r["pp"], r["tg"]) == ((int(r["test"][2:]), 0) if r["test"].startswith("pp") else (0, int(r["test"][2:])))
               for r in js)
    jl = [json.loads(l) for l in run(*args, "-o", "jsonl").check_ok().out.splitlines()]
    assert [(r["threads"], r["n_batch"], r["test"]) for r in jl] == want
    cs = list(csv.DictReader(io.StringIO(run(*args, "-o", "csv").check_ok().out)))
    assert [(int(r["threads"]), int(r["n_batch"]), r["test"]) for r in cs] == want
    md = run(*args).check_ok().out.splitlines()
    head = [c.strip() for c in md[0].strip("|").split("|")]
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in md[2:] if l.startswith("|")]
    ti, bi, xi = head.index("threads"), head.index("n_batch"), head.index("test")
    assert [(int(r[ti]), int(r[bi]), r[xi]) for r in rows] == want, md
    # without -b: no n_batch column in the table; the machine formats still say which (the default, 512)
    res = run("bench", "model", "-m", stories["bin"], "-p", "8", "-n", "0", "-r", "1", "-t", "1").check_ok()
    assert "n_batch" not in res.out
    assert json.loads(run("bench", "model", "-m", stories["bin"], "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-o",
                          "json").check_ok().out)[0]["n_batch"] == 512


def test_bench_kv_type(run, stories):
    """--kv-type picks the KV cache's type (the kv column and llama-bench's type_k / type_v say which); an unknown
    type is a usage error that lists the known ones."""
    args = ["bench", "model", "-m", stories["bin"], "-p", "0", "-n", "4", "-r", "1", "-t", "1", "--kv-type", "int8"]
    md = run(*args).check_ok().out.splitlines()
    head = [c.strip() for c in md[0].strip("|").split("|")]
    assert [c.strip() for c in md[2].strip("|").split("|")][head.index("kv")] == "int8", md
    js = json.loads(run(*args, "-o", "json").check_ok().out)
    assert js[0]["type_k"] == js[0]["type_v"] == "int8", js
    assert json.loads(run(*args[:-2], "-o", "json").check_ok().out)[0]["type_k"] == "f16"
    res = run(*args[:-1], "int9")
    assert res.returncode == 2 and "int9" in res.err and "fp8" in res.err, res.describe()


def test_bench_long_model_name_keeps_columns(run, stories, tmp_path):
    long = tmp_path / ("a-model-with-a-rather-long-file-name-for-the-table-" + "x" * 20 + ".bin")
    long.symlink_to(stories["bin"])
    res = run("bench", "model", "-m", long, "-p", "8", "-n", "0", "-r", "1", "-t", "1").check_ok()
    lines = [l for l in res.out.splitlines() if l.startswith("|")]
    assert len({len(l) for l in lines}) == 1 and long.name in lines[2], res.out


def test_bench_help_lists_every_bench(run):
    res = run("bench", "--help").check_ok()
    for kind in ("model", "throughput", "prefix", "serve", "membw"):
        assert re.search(rf"^  {kind} ", res.out, re.M), res.out
    pre = run("bench", "prefix", "--help").check_ok()
    assert "P % (default 90)" in pre.out and "%%" not in pre.out


# ---- chat -------------------------------------------------------------------------------------

class Pty:
    """kvllm under a pseudo-terminal (pty.fork): stdin, stdout and stderr are the terminal, and a
    written \\x03 is Ctrl-C (the line discipline sends SIGINT)."""

    def __init__(self, argv: list[str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(argv[0], argv)
        self.buf = b""

    def expect(self, pattern: bytes, timeout: float = 120.0) -> bytes:
        """Read until `pattern` (a regex) appears after what was already consumed; returns the text up to it."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.buf)
            if m:
                out, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{pattern!r} not seen in {timeout}s; got {self.buf[-2000:]!r}")
            r, _, _ = select.select([self.fd], [], [], left)
            if r:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"{pattern!r}: the process ended; got {self.buf[-2000:]!r}")
                self.buf += chunk

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:   # drain, so the child never blocks on a full terminal
                if select.select([self.fd], [], [], 0.05)[0]:
                    self.buf += os.read(self.fd, 4096)
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError("no exit")


def test_chat_ctrl_c_stops_the_answer(kvllm, smollm2, f32_answers):
    p = Pty([str(kvllm), "chat", "-m", str(smollm2), "--temp", "0", "-n", "400", "-c", "2048", "-t", "1"])
    try:
        p.expect(rb"\n> ")
        p.send(b"/help\n")
        p.expect(rb"/clear.*\n.*/exit.*\n(.*\n)*> ")
        p.send(b"Write a very long story about a dragon who learns to cook, with many chapters.\n")
        # the line is read (a Ctrl-C before that would discard it: the terminal flushes its input)
        p.expect(rb"turn 1: prompt [^\n]*\n")
        p.expect(rb"\w+ \w+ \w+ \w+ \w+")   # the answer is being written
        p.send(b"\x03")
        got = p.expect(rb"stopped by Ctrl-C.*\n> ")
        assert b"answer" in got
        p.send(b"What is the capital of France?\n")
        got = p.expect(rb"\n> ")
        assert b"Paris" in got, got
        p.send(b"\x03")
        p.expect(rb"Ctrl-C again")
        p.send(b"\x03")
        assert p.wait() == 0
    finally:
        try:
            os.kill(p.pid, signal.SIGKILL)
            os.waitpid(p.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_chat_outgrows_the_context(run, smollm2):
    """A conversation four times longer than -c goes on to the end: the oldest turns after the system
    message are dropped with a note, every turn is answered, the system prompt's cache is reused, and the
    turns kept stay cached (context shift): a turn that drops computes only its new message."""
    ctx = 200
    questions = [f"Question {i}: what is {i} plus {i}? Answer in one sentence and show the steps." for i in range(24)]
    res = run("chat", "-m", smollm2, "-c", ctx, "-n", "32", "--temp", "0", "--interactive", "-t", "1",
              "-sys", "You are a calculator.", stdin=("\n".join(questions) + "\n/exit\n").encode()).check_ok()
    answered = [int(n) for n in re.findall(r"turn \d+: answer (\d+) tokens", res.err)]
    assert len(answered) == 24, res.err[-3000:]
    q_tokens = len(parse_ids(run("tokenize", "-m", smollm2, "--ids", "\n".join(questions)).check_ok().out))
    assert q_tokens + sum(answered) >= 4 * ctx, (q_tokens, answered)   # the conversation: 4 contexts or more
    assert re.findall(r"dropped the (\d+) oldest message", res.err), res.err[-3000:]
    prompts = [int(x) for x in re.findall(r"turn \d+: prompt (\d+) tokens", res.err)]
    assert max(prompts) < ctx, prompts
    # the system message stayed: every prompt still starts with its tokens, reused from the KV cache
    reuse = [int(x) for x in re.findall(r"prompt \d+ tokens: (\d+) reused", res.err)]
    assert all(r >= 5 for r in reuse[1:]), reuse
    drops = {int(t) for t in re.findall(r"turn (\d+): the conversation outgrew", res.err)}
    shifts = {int(t): int(n) for t, n in re.findall(r"turn (\d+): context shift: (\d+) cached tokens", res.err)}
    assert len(drops) >= 10 and set(shifts) == drops and min(shifts.values()) >= 40, (drops, shifts)
    computed = {int(t): int(n) for t, n in re.findall(r"turn (\d+): prompt \d+ tokens: \d+ reused from the KV "
                                                      r"cache, (\d+) computed", res.err)}
    q_max = max(len(parse_ids(run("tokenize", "-m", smollm2, "--ids", q).check_ok().out)) for q in questions[-3:])
    # the new message with its template tokens (<|im_start|>user ... <|im_start|>assistant) and the end of
    # the previous answer: the kept turns are not among them
    assert all(computed[t] <= q_max + 12 for t in drops), (computed, q_max)


def test_chat_clear_and_file(run, smollm2, tmp_path, f32_answers):
    res = run("chat", "-m", smollm2, "--temp", "0", "-n", "32", "--interactive", "-t", "1",
              stdin=b"My name is Zorblax.\n/clear\nWhat is the capital of France?\n/exit\n").check_ok()
    assert "conversation cleared" in res.err
    prompts = [int(x) for x in re.findall(r"turn \d+: prompt (\d+) tokens", res.err)]
    assert len(prompts) == 2 and prompts[1] < prompts[0] + 10, res.err   # the first turn is gone
    f = tmp_path / "q.txt"
    f.write_text("What is the capital of France?\n")
    res = run("chat", "-m", smollm2, "--temp", "0", "-n", "32", "-f", f, "-sys", "You are a helpful assistant.", "-q").check_ok()
    assert "Paris" in res.out


# ---- help and docs ----------------------------------------------------------------------------

def test_every_command_has_help_and_readme_lists_it(run):
    from kvtest import REPO
    top = run("--help").check_ok().out
    cmds = re.findall(r"^  (\w+) ", top.split("commands:")[1], re.M)
    assert {"run", "chat", "serve", "bench", "info", "tokenize", "quantize"} <= set(cmds), top
    readme = (REPO / "README.md").read_text()
    listed = readme[readme.index("The commands (`kvllm --help`)"):][:600]
    for c in cmds:
        res = run(c, "--help")
        assert res.returncode == 0 and "usage" in res.out.lower(), res.describe()
        assert f"`{c}`" in listed, f"README's command list lacks {c}"
    assert "--version" in top
    cli_md = (REPO / "docs" / "CLI.md").read_text()
    for flag in ("-ngl", "--parse-special", "--served-model-name", "/tokenize", "-o md", "--allowed-origins"):
        assert flag in cli_md


@pytest.mark.parametrize("cmd", ["run", "chat", "serve"])
def test_help_names_every_option_it_parses(run, cmd):
    """The options the issue names are in --help (so the 'did you mean' suggestions can find them)."""
    out = run(cmd, "--help").check_ok().out
    want = {"run": ["-f", "-sys", "--parse-special", "--color", "--version", "-n"],
            "chat": ["-sys", "--system-prompt", "-f", "/help"],
            "serve": ["--served-model-name", "--max-model-len", "-np", "--parallel", "--host", "--port", "--jinja",
                      "--allowed-origins", "--log-format"]}[cmd]
    for w in want:
        assert w in out, (cmd, w)


# ---- info -------------------------------------------------------------------------------------

def test_info_text_and_json(run, smollm2):
    out = run("info", smollm2).check_ok().out
    for want in ("name ", "file type         MOSTLY_Q4_1", "bits per weight", "tokenizer         gpt2, pre-tokenizer ",
                 "add_bos / add_eos", "chat template     yes", "placed bytes"):
        assert want in out, (want, out)
    j = json.loads(run("info", "--json", smollm2).check_ok().out)
    assert j["architecture"] == "llama" and j["n_layer"] == 30 and j["chat_template"] is True
    assert j["tokenizer_model"] == "gpt2" and j["tokenizer_pre"] and j["file_type"] == "MOSTLY_Q4_1"
    assert 4.5 < j["bits_per_weight"] < 6.5 and j["placed_bytes"] > 0 and j["weight_bytes"] > 0
    assert j["kv_bytes_per_token"]["f16"] == 2 * 30 * 3 * 64 * 2


# ---- tokenize ---------------------------------------------------------------------------------

def test_tokenize_shows_text_and_raw_pieces(run, shared):
    """Pieces as the text they stand for, quoted (as llama-tokenize shows them); --raw-pieces as stored."""
    g = shared / "tokenizers" / "gpt2"
    bpe = ["--vocab", g / "encoder.json", "--merges", g / "vocab.bpe"]
    out = run("tokenize", *bpe, "hello world's \u65e5 \\\n").check_ok().out
    # Ġ -> space, Ċ -> newline; quote and backslash escaped; 日 (E6 97 A5) split over byte tokens: escapes
    assert out == ("31373\t'hello'\n995\t' world'\n338\t'\\'s'\n10545\t' \\xE6'\n245\t'\\x97'\n98\t'\\xA5'\n"
                   "3467\t' \\\\'\n198\t'\\n'\n"), out
    raw = run("tokenize", *bpe, "--raw-pieces", "hello world\n").check_ok().out
    assert raw == "31373\thello\n995\t\u0120world\n198\t\u010a\n", raw
    spm = ["-m", shared / "tokenizers" / "llamacpp-vocab" / "ggml-vocab-llama-spm.gguf"]
    out = run("tokenize", *spm, "Hello world\n \u00fc").check_ok().out
    assert out == "1\t'<s>'\n15043\t' Hello'\n3186\t' world'\n13\t'\\n'\n2505\t' \u00fc'\n", out  # ▁, <0x0A>, BOS
    raw = run("tokenize", *spm, "--raw-pieces", "Hello world\n").check_ok().out
    assert raw == "1\t<s>\n15043\t\u2581Hello\n3186\t\u2581world\n13\t<0x0A>\n", raw
    res = run("tokenize", *spm, "--raw-pieces", "--ids", "Hello")
    assert res.returncode == 2 and "--raw-pieces" in res.err, res.describe()


def test_quantize_trailing_thread_count_as_llama_quantize(run, tmp_path):
    """llama-quantize IN OUT TYPE [nthreads]: the trailing number is the thread count, the output the
    same bytes as with -t."""
    from gen_model import ModelConfig, write_model
    src = write_model(tmp_path / "f32.gguf", ModelConfig(n_vocab=300, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                                                         n_ff=128), seed=3)
    a = run("quantize", src, tmp_path / "a.gguf", "Q8_0", "1").check_ok()
    assert "(1 threads)" in a.err, a.err
    run("quantize", src, tmp_path / "b.gguf", "Q8_0", "-t", "2").check_ok()
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    bad = run("quantize", src, tmp_path / "c.gguf", "Q8_0", "two")
    assert bad.returncode == 2 and "nthreads" in bad.err, bad.describe()
    extra = run("quantize", src, tmp_path / "c.gguf", "Q8_0", "1", "x")
    assert extra.returncode == 2 and "unexpected argument 'x'" in extra.err, extra.describe()


# ---- habits, round two: inline grammars, template names, -cnv, -fa 1, --opt=value ----------------

def test_run_inline_json_schema_and_grammar(run, st, tmp_path):
    """llama-cli's --json-schema / -j and --grammar take the text itself; -jf, --json-schema-file and
    --grammar-file take a file; a path given to the inline options is still read (kvllm's older habit)."""
    gen = [*st, "-p", "x", "-n", "16", "--temp", "0", "-q", "--no-echo"]
    for flag in ("--json-schema", "-j"):
        res = run("run", *gen, flag, '{"enum": ["yes", "no"]}').check_ok()
        assert json.loads(res.out) in ("yes", "no"), res.describe()
    res = run("run", *gen, "--grammar", 'root ::= "upon a time"').check_ok()
    assert res.out.strip() == "upon a time", res.describe()
    s = tmp_path / "s.json"
    s.write_text('{"type": "boolean"}')
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "yes"\n')
    for args in (["-jf", s], ["--json-schema-file", s], ["--json-schema", s]):
        res = run("run", *gen, *args).check_ok()
        assert json.loads(res.out) in (True, False), res.describe()
    for args in (["--grammar-file", g], ["--grammar", g]):
        assert run("run", *gen, *args).check_ok().out.strip() == "yes"
    # an inline error names the option and the compiler's place; a file's names the file
    res = run("run", *gen, "--grammar", 'root ::= "a" missing')
    assert res.returncode == 1 and "--grammar: 1:14" in res.err, res.describe()
    res = run("run", *gen, "-j", '{"type": "object", "properties": 3}')
    assert res.returncode == 1 and "--json-schema:" in res.err, res.describe()
    res = run("run", *gen, "--grammar-file", 'root ::= "a"')
    assert res.returncode == 1 and "cannot open" in res.err, res.describe()


TEMPLATE_TURNS = {
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "llama3": ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
               "<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    "gemma": "<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n",
    "zephyr": "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nhi<|endoftext|>\n<|assistant|>\n",
}


@pytest.mark.parametrize("name", sorted(TEMPLATE_TURNS))
def test_chat_template_by_llamacpp_name(run, st, name):
    """--chat-template NAME renders what llama.cpp's built-in of that name writes (chat -v prints it)."""
    res = run("chat", *st, "--chat-template", name, "-sys", "Be brief.", "-p", "hi", "-n", "2", "--temp", "0",
              "-v").check_ok()
    assert TEMPLATE_TURNS[name] in res.err, res.describe()


def test_chat_template_text_file_and_refusals(run, st, tmp_path, chatml):
    base = [*st, "-p", "hi", "-n", "2", "--temp", "0", "-v"]
    inline = "{% for m in messages %}[{{ m['role'] }}:{{ m['content'] }}]{% endfor %}"
    assert "[user:hi]" in run("chat", *base, "--chat-template", inline).check_ok().err
    assert "<|im_start|>user\nhi<|im_end|>" in run("chat", *base, "--chat-template-file", chatml).check_ok().err
    assert "<|im_start|>user\nhi<|im_end|>" in run("chat", *base, "--chat-template", chatml).check_ok().err
    # llama.cpp's names that kvllm lacks are refused by name, saying what to use
    res = run("chat", *base, "--chat-template", "llama2")
    assert res.returncode != 0 and "'llama2' is not one kvllm has" in res.err, res.describe()
    assert "chatml" in res.err and "--chat-template-file" in res.err, res.err
    res = run("chat", *base, "--chat-template", "no-such-name")
    assert res.returncode != 0 and "--chat-template-file" in res.err, res.describe()
    res = run("serve", *st, "--chat-template", "vicuna", "--port", "0")
    assert res.returncode != 0 and "'vicuna' is not one kvllm has" in res.err, res.describe()


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("tool_flags", [[], ["--enable-auto-tool-choice", "--tool-call-parser=hermes"]])
def test_serve_chat_template_name_tool_parser_and_opt_equals(kvllm, stories, tool_flags):
    """serve --chat-template chatml (llama.cpp's name), --opt=value, and vLLM's tool flags: ChatML shows no
    tool-call format, so `tools` is a 400 until --tool-call-parser names one."""
    from server_util import Server
    s = Server(kvllm, f"--model={stories['bin']}", f"--tokenizer={stories['tok']}", "--threads=1",
               "--chat-template=chatml", "--alias=storyteller", "--max-queue=8", *tool_flags)
    try:
        status, _, raw = s.request("GET", "/v1/models")
        assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == ["storyteller"], raw
        body = {"model": "storyteller", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "hi"}]}
        status, r = s.post("/v1/chat/completions", body)
        assert status == 200 and r["choices"][0]["message"]["content"] is not None, r
        status, r = s.post("/v1/chat/completions", {**body, "tools": TOOLS})
        assert status == (200 if tool_flags else 400), r
    finally:
        s.stop()


def test_serve_refuses_unknown_tool_parser(run, st):
    res = run("serve", *st, "--tool-call-parser", "pythonic", "--port", "0")
    assert res.returncode == 2 and "hermes, llama3_json and mistral" in res.err, res.describe()


def test_cnv_refused_by_run_accepted_by_chat(run, st):
    res = run("run", *st, "-p", "hi", "-cnv")
    assert res.returncode == 2 and "kvllm chat" in res.err, res.describe()
    res = run("chat", *st, "--chat-template", "chatml", "-p", "hi", "-n", "2", "--temp", "0", "-cnv").check_ok()
    assert "unknown option" not in res.err


@pytest.mark.parametrize("fa", [["-fa", "1"], ["-fa", "0"], ["-fa", "on"], ["-fa", "off"], ["-fa", "0,1"],
                                ["--flash-attn=off"], ["-fa"]])
def test_bench_and_run_take_flash_attn_values(run, stories, st, fa):
    """-fa as llama-bench writes it (0, 1, a list) and as llama-cli does (on, off): a note, no error."""
    res = run("bench", "model", "-m", stories["bin"], "-p", "8", "-n", "4", "-r", "1", *fa).check_ok()
    assert "ignored: attention is always fused" in res.err, res.describe()
    assert "| pp8 " in res.out and "| tg4 " in res.out, res.describe()
    res = run("run", *st, "-p", "Once", "-n", "2", "--temp", "0", *fa).check_ok()
    assert "ignored: attention is always fused" in res.err, res.describe()


def test_opt_equals_value_everywhere(run, stories, st, tmp_path):
    """--opt=value as well as --opt value (argparse's habit), on every command; a flag given a value is
    refused, and a value that itself holds '=' or starts with '--' is kept whole."""
    m = f"--model={stories['bin']}"
    tk = f"--tokenizer={stories['tok']}"
    a = run("run", m, tk, "--prompt=Once", "--n-predict=8", "--temp=0", "--seed=3", "--ids", "-q").check_ok()
    b = run("run", "-m", stories["bin"], "--tokenizer", stories["tok"], "-p", "Once", "-n", "8", "--temp", "0",
            "--ids", "-q").check_ok()
    assert a.out == b.out and a.out.strip(), (a.describe(), b.describe())
    assert run("run", m, tk, "--prompt=a=b", "-n", "1", "-q").check_ok().out.startswith("a=b")
    assert run("run", *st, "-p", "--x=y", "-n", "1", "-q").check_ok().out.startswith("--x=y")
    assert run("run", m, tk, "-p", "x", "-n", "1", "--color=off", "--kv-tokens=64", "--block-size=8").check_ok()
    res = run("run", m, tk, "-p", "x", "--ignore-eos=1")
    assert res.returncode == 2 and "--ignore-eos takes no value" in res.err, res.describe()
    res = run("run", m, tk, "-p", "x", "--ignore-eos=1", "-n", "1")
    assert res.returncode == 2 and "--ignore-eos takes no value" in res.err, res.describe()
    assert run("chat", m, tk, "--chat-template=chatml", "--prompt=hi", "--n-predict=2", "--temp=0").check_ok()
    assert "tg4" in run("bench", "model", m, "--pp=8", "--tg=4", "--reps=1", "--threads=1").check_ok().out
    assert run("bench", "throughput", "-m", stories["bin"], "--requests=4", "--prompt-len=8",
               "--gen-len=4").check_ok()
    assert run("tokenize", f"--tokenizer={stories['tok']}", "--ids", "hello").check_ok().out.strip()
    out = tmp_path / "s.gguf"
    run("convert", stories["bin"], tk, "--to=gguf", "-o", out).check_ok()
    assert out.stat().st_size > 1_000_000
    assert run("info", stories["bin"], "--json").check_ok()
    res = run("info", stories["bin"], "--json=yes")
    assert res.returncode == 2 and "takes no value" in res.err, res.describe()
