"""kvtest.py — helpers shared by kvllm's Python tests: run the CLI, read eval logits, sanitizer checks.

No fixtures here (see conftest.py), so test files may import these directly.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from mpi_procs import mpi_rank_pids  # noqa: F401  (tests import it from here)

REPO = Path(__file__).resolve().parents[2]


def data_dir() -> Path:
    """The test data: $KVLLM_SHARED when set, else the repository's own tests/data (a clone carries it:
    tests/data/README.md), else an older ../shared beside the repository, the only place it used to be."""
    env = os.environ.get("KVLLM_SHARED")
    if env:
        return Path(env).resolve()
    own = REPO / "tests" / "data"
    if own.is_dir() or not (REPO.parent / "shared").is_dir():
        return own
    return (REPO.parent / "shared").resolve()

DEFAULT_TIMEOUT = 300

# ---- the suites as a tensor-parallel job (docs/TP.md) ------------------------------------------------------
# KVLLM_TEST_MPI_NP=N (N > 1): the servers of server_util.Server and the runs of run_batch start as
# `mpirun -np N --oversubscribe kvllm ...`, so the serve, tools, constrained and speculative suites check
# the tensor-parallel job through the same assertions as the single process (tests/CMakeLists.txt's
# py_mpi_suites).  Servers are stopped with SIGUSR1 to mpirun, the drain signal mpirun forwards.
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpi_np() -> int:
    """The ranks KVLLM_TEST_MPI_NP asks for; 1 (run alone) when unset."""
    v = os.environ.get("KVLLM_TEST_MPI_NP", "")
    if not v:
        return 1
    if not v.isdigit() or int(v) < 1:
        pytest.fail(f"KVLLM_TEST_MPI_NP={v!r} is not a number of ranks")
    return int(v)


def mpi_launch(binary: str | Path) -> tuple[list[str], dict[str, str]]:
    """(argv prefix, extra environment) that start `binary` as the job KVLLM_TEST_MPI_NP asks for; ([binary], {})
    alone."""
    n = mpi_np()
    if n == 1:
        return [str(binary)], {}
    import shutil   # noqa: PLC0415
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.fail(f"KVLLM_TEST_MPI_NP={n} but no mpirun on PATH (scripts/bootstrap.sh installs openmpi-bin)")
    return [mpirun, "-np", str(n), "--oversubscribe", str(binary)], dict(MPI_ENV)


def tp_splittable(path: Path) -> Path:
    """Under KVLLM_TEST_MPI_NP=N, a real model whose heads do not split over N ranks (SmolLM2: 3 KV heads) is
    served as tp_model.py's equivalent file (KV heads replicated, zero heads padded: the same function) of the
    same name, kept under <repo>/models/tp; alone, the file itself."""
    from tp_model import splittable   # noqa: PLC0415
    return splittable(path, mpi_np(), REPO / "models" / "tp")


SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "runtime error", "UndefinedBehaviorSanitizer")


@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    def describe(self) -> str:
        so = self.out if len(self.out) < 2000 else self.out[:2000] + "...[truncated]"
        se = self.err if len(self.err) < 4000 else self.err[:4000] + "...[truncated]"
        return f"$ {' '.join(self.args)}\n-> rc {self.returncode}\n--- stdout ---\n{so}\n--- stderr ---\n{se}"

    def check_ok(self) -> "Result":
        assert self.returncode == 0, self.describe()
        return self


# the subcommands that run an engine: KVLLM_TEST_ENGINE_ARGS (whitespace-separated) follows each of them, so a
# whole suite runs again with an engine setting, e.g. --enforce-eager (tests/CMakeLists.txt)
ENGINE_COMMANDS = ("run", "batch", "eval", "chat")


def run_cli(binary: str | Path, *args, timeout: float = DEFAULT_TIMEOUT, stdin: bytes | None = None,
            env: dict[str, str] | None = None) -> Result:
    """Run `binary args...`, capturing stdout and stderr as bytes (no shell)."""
    args = [str(a) for a in args]
    extra = os.environ.get("KVLLM_TEST_ENGINE_ARGS", "").split()
    if extra and args and args[0] in ENGINE_COMMANDS:
        args = [args[0], *extra, *args[1:]]
    argv = [str(binary)] + args
    e = dict(os.environ)
    # ASan/UBSan: use exit codes that cannot be confused with kvllm's own 1 / 2.
    e["ASAN_OPTIONS"] = "exitcode=86:abort_on_error=0:" + e.get("ASAN_OPTIONS", "")
    e["UBSAN_OPTIONS"] = "print_stacktrace=1:exitcode=87:" + e.get("UBSAN_OPTIONS", "")
    if env:
        e.update(env)
    try:
        p = subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, env=e, stdin=None if stdin is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as ex:
        pytest.fail(f"timed out after {timeout}s: {' '.join(argv)}\nstderr so far: {ex.stderr!r}"[:4000])
    return Result(argv, p.returncode, p.stdout, p.stderr)


def fetched_model(kvllm: Path, what: str, env: str, default: Path, script: str) -> Path:
    """The file $env names, else `default`, else what `script` fetches (it prints the path last).  Skips only when
    this machine cannot download it (the script says "cannot download", or it times out); any other failure of the
    fetch, and any failure of kvllm to tokenize with the file, fails the test: a tokenizer regression must never
    pass as a skip."""
    v = os.environ.get(env)
    p = Path(v) if v else default
    if not p.is_file():
        if v:
            pytest.fail(f"{env}={v} is not a file")
        try:
            r = subprocess.run(["bash", str(REPO / "scripts" / script)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.skip(f"this machine could not download {what}: scripts/{script} timed out")
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip()
            last = (err.splitlines() or ["no message"])[-1]
            if "cannot download" in last:  # the script's message when pip itself fails: no network / no PyPI
                pytest.skip(f"this machine cannot download {what} from PyPI: {last}")
            pytest.fail(f"scripts/{script} failed (rc {r.returncode}):\n{err[-2000:]}")
        p = Path(r.stdout.decode().strip().splitlines()[-1])
    res = run_cli(kvllm, "tokenize", "-m", p, "hi")
    if res.returncode != 0:
        pytest.fail(f"kvllm tokenize failed on {p}:\n{res.describe()}")
    return p


def cpu_lacks(*flags: str) -> list[str]:
    """The flags of /proc/cpuinfo (e.g. "avx2", "fma", "f16c") this machine lacks.  A test may skip only on
    what the machine lacks, read here independently of kvllm's own detection (which is under test)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return list(flags)
    have: set[str] = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            have.update(line.split(":", 1)[1].split())
    return [f for f in flags if f not in have]


AVX2_FLAGS = ("avx2", "fma", "f16c")  # what kvllm's avx2 kernel set needs


def assert_no_sanitizer(res: Result) -> None:
    for m in SANITIZER_MARKERS:
        assert m not in res.err, f"sanitizer report ({m}):\n{res.describe()}"
    assert res.returncode >= 0, f"killed by signal {-res.returncode}:\n{res.describe()}"
    assert res.returncode not in (86, 87), f"sanitizer exit code:\n{res.describe()}"


def check_refused(res: Result, name: str, quiet: bool = True) -> None:
    """Bad input was refused as the ground rules ask: exit status 1, no sanitizer report, exactly one
    'kvllm: error:' line and it names `name` (the file or field at fault); with -q (quiet) nothing else."""
    assert_no_sanitizer(res)
    assert res.returncode == 1, f"expected exit status 1:\n{res.describe()}"
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("kvllm: error:")]
    assert len(errs) == 1, f"expected exactly one 'kvllm: error:' line:\n{res.describe()}"
    assert name in errs[0], f"error line should name {name!r}: {errs[0]!r}"
    if quiet:
        assert lines == errs, f"with -q stderr should hold only the error line:\n{res.describe()}"


def read_logits(path: str | Path, n_tokens: int) -> np.ndarray:
    """kvllm eval output: n_tokens x n_vocab float32 little-endian."""
    raw = np.fromfile(path, dtype="<f4")
    assert raw.size > 0 and raw.size % n_tokens == 0, \
        f"{path}: {raw.size} floats is not a multiple of {n_tokens} tokens"
    return raw.reshape(n_tokens, raw.size // n_tokens)


def eval_logits(binary: str | Path, model: str | Path, tokens: Sequence[int], out: str | Path, *,
                prefill: int | None = None, no_kv_cache: bool = False, threads: int | None = None,
                extra: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT,
                act: str = "f32") -> np.ndarray:
    """Run `kvllm eval` and return its logits (n_tokens, n_vocab).

    act: KVLLM_ACT for the run.  f32 (the default here; kvllm's own is q8) keeps every weight type on
    f32 arithmetic, which the reference comparisons' 1e-4 bounds are made for; "int" and "q8" take
    integer activations (relative error about 1e-3 and 1e-2); "" leaves kvllm's own default."""
    args = ["eval", "-m", model, "--tokens", " ".join(str(int(t)) for t in tokens)]
    if prefill is not None:
        args += ["--prefill", str(prefill)]
    if no_kv_cache:
        args.append("--no-kv-cache")
    if threads is not None:
        args += ["-t", str(threads)]
    args += list(extra)
    args += ["-o", out]
    Path(out).unlink(missing_ok=True)
    res = run_cli(binary, *args, timeout=timeout, env={"KVLLM_ACT": act})
    assert_no_sanitizer(res)
    assert res.returncode == 0, res.describe()
    return read_logits(out, len(tokens))


def shared_prefix_prompts(rng: np.random.Generator, n: int, n_vocab: int, n_shared: int, head_min: int,
                          phrase_max: int) -> list[list[int]]:
    """n prompts of token ids: BOS, a prefix of one shared run of n_shared ids (head_min ids or more: prefix-cache
    hits of several lengths, some cut back), then a phrase of 2 .. phrase_max ids repeated 1 to 3 times (what
    prompt-lookup drafting finds)."""
    shared = rng.integers(3, n_vocab, size=n_shared).tolist()
    prompts = []
    for _ in range(n):
        head = shared[:int(rng.integers(head_min, n_shared + 1))]
        phrase = rng.integers(3, n_vocab, size=int(rng.integers(2, phrase_max + 1))).tolist()
        prompts.append([1] + head + phrase * int(rng.integers(1, 4)))
    return prompts


def run_batch(binary: str | Path, d: Path, model: str | Path, prompts: Sequence[Sequence[int]], name: str, *extra,
              n_vocab: int, max_tokens: int, logits: bool = True, timeout: float = 900
              ) -> tuple[list[list[int]], np.ndarray | None, dict]:
    """`kvllm batch` over token-id prompts (files named `name` under d): the ids of every output, the logits of
    every step (n_outputs, max_tokens, n_vocab; f32 KV) unless logits=False, and the stats line as a dict
    (preemptions, prompt, cached, held; spec: accepted and drafted when speculation ran, else None; planned_ahead:
    the steps planned while the previous one ran, asynchronous scheduling).  Fails on a
    sanitizer report, a non-zero exit or a KV block still held at the end (a leak)."""
    pf = d / f"{name}.txt"
    pf.write_text("".join(" ".join(map(str, p)) + "\n" for p in prompts))
    lf = d / f"{name}.bin"
    args = ["--logits", lf, "--kv-type", "f32"] if logits else []
    launch, env = mpi_launch(binary)   # a tensor-parallel job when KVLLM_TEST_MPI_NP asks for one
    res = run_cli(launch[0], *launch[1:], "batch", "-m", model, "--prompts", pf, "--max-tokens", max_tokens, *args,
                  *extra, timeout=timeout, env=env)
    assert_no_sanitizer(res)
    assert res.returncode == 0, res.describe()
    ids = [list(map(int, line.split())) for line in res.out.splitlines()]
    lg = np.fromfile(lf, dtype="<f4").reshape(len(ids), max_tokens, n_vocab) if logits else None
    m = re.search(r"preemptions (\d+), prompt tokens (\d+), cached (\d+), blocks held (\d+)", res.err)
    assert m, res.describe()
    # no leaks: every block is free (or cached, which counts as free) once all requests are done
    assert int(m[4]) == 0, f"{name}: {m[4]} blocks held after the run\n{res.describe()}"
    w = re.search(r"sliding-window blocks held (\d+) of (\d+)", res.err)   # the windowed layers' own pool
    assert not w or int(w[1]) == 0, f"{name}: {w[1]} sliding-window blocks held after the run\n{res.describe()}"
    sp = re.search(r"speculation \(([a-z ]+)\): (\d+) of (\d+) drafts accepted", res.err)
    stats = dict(preemptions=int(m[1]), prompt=int(m[2]), cached=int(m[3]), held=int(m[4]),
                 spec=dict(accepted=int(sp[2]), drafted=int(sp[3])) if sp else None,
                 blocks=int(re.search(r"free \d+ of (\d+)", res.err)[1]), win_blocks=int(w[2]) if w else 0,
                 planned_ahead=int(re.search(r"planned ahead (\d+)", res.err)[1]))
    return ids, lg, stats


def parse_ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


# label spellings accepted for each hyper-parameter in `kvllm info` output
INFO_LABELS = {
    "n_embd": ["n_embd", "embedding_length", "embd", "dim", "hidden"],
    "n_layer": ["n_layer", "block_count", "layer", "blocks"],
    "n_head": ["n_head", "head_count", "heads"],
    "n_head_kv": ["n_head_kv", "head_count_kv", "kv_head", "kv heads"],
    "n_vocab": ["n_vocab", "vocab"],
    "n_ff": ["n_ff", "feed_forward", "ffn", "hidden_dim"],
    "n_ctx_train": ["n_ctx", "context"],
}


def check_info(text: str, expect: dict[str, int]) -> None:
    """Each expected hyper-parameter appears as a whole number on a line carrying one of its labels."""
    import re
    lines = text.splitlines()
    for field, value in expect.items():
        num = re.compile(rf"(?<![\w.]){value}(?![\w.])")
        labels = INFO_LABELS[field]
        hit = [ln for ln in lines if any(lb in ln.lower() for lb in labels) and num.search(ln)]
        assert hit, f"`kvllm info` should report {field} = {value} on a labelled line:\n{text}"
