"""Every writer (convert to GGUF, convert --to hf, quantize) replaces its target whole or not at all.

Once, `kvllm convert X -o X` truncated X while X was still mapped (bus error, X left 0 bytes),
and `convert DIR --to hf -o DIR` did the same to model.safetensors.  Now an output that is the input (same
file, through a link too, or a folder holding the input) is refused with a clear error and exit 1, and every
file is written to a temporary file beside its target and renamed into place only when complete.

An interrupted write is simulated with RLIMIT_FSIZE (the file-size limit of the writing process): with
SIGXFSZ at its default the kernel kills the process in the middle of the write (as SIGKILL would, nothing
can clean up), and with SIGXFSZ ignored the write fails with EFBIG as on a full disk (the error path).
Either way the old target must be intact; on the error path no temporary file may remain.
"""
from __future__ import annotations

import hashlib
import os
import resource
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from kvtest import run_cli

LIMIT = 64 * 1024  # bytes a writer may write before it is stopped: the models are ~1 MB


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tree(d: Path) -> dict[str, str]:
    """name -> sha256 of every file in d (hidden ones included)."""
    return {p.name: sha(p) for p in sorted(d.iterdir()) if p.is_file()}


def run_limited(kvllm, *args, kill: bool):
    """Run kvllm with a file-size limit: kill=True dies by SIGXFSZ midway, False gets EFBIG errors."""
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL if kill else signal.SIG_IGN)
    return subprocess.run([str(kvllm), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, preexec_fn=pre, timeout=120)


@pytest.fixture
def gguf_model(kvllm, stories, tmp_path) -> Path:
    """stories260K with its vocabulary as a GGUF file (about 1 MB) in its own folder."""
    d = tmp_path / "g"
    d.mkdir()
    out = d / "x.gguf"
    run_cli(kvllm, "convert", stories["bin"], "--tokenizer", stories["tok"], "-o", out).check_ok()
    return out


@pytest.fixture
def hf_model(kvllm, gguf_model, tmp_path) -> Path:
    d = tmp_path / "hf"
    run_cli(kvllm, "convert", gguf_model, "--to", "hf", "-o", d).check_ok()
    assert (d / "model.safetensors").stat().st_size > 10 * LIMIT
    return d


# ---- an output that is the input is refused, and nothing is touched ------------

def refused(res, what: str):
    assert res.returncode == 1, res.describe()  # not a signal (the old bus error), not success
    assert what in res.err, res.describe()


def test_convert_same_file_refused(kvllm, gguf_model):
    before = tree(gguf_model.parent)
    refused(run_cli(kvllm, "convert", gguf_model, "-o", gguf_model), "is the input")
    os.symlink(gguf_model.name, gguf_model.parent / "link.gguf")
    os.link(gguf_model, gguf_model.parent / "hard.gguf")
    refused(run_cli(kvllm, "convert", gguf_model, "-o", gguf_model.parent / "link.gguf"), "is the input")
    refused(run_cli(kvllm, "convert", gguf_model, "-o", gguf_model.parent / "hard.gguf"), "is the input")
    after = tree(gguf_model.parent)
    assert after.pop("hard.gguf") == after.pop("link.gguf") == before["x.gguf"]
    assert after == before
    assert (gguf_model.parent / "link.gguf").is_symlink()


def test_convert_tokenizer_input_refused(kvllm, stories, gguf_model, tmp_path):
    """--tokenizer FILE is an input too."""
    tok = tmp_path / "tok.bin"
    tok.write_bytes(stories["tok"].read_bytes())
    old = sha(tok)
    refused(run_cli(kvllm, "convert", stories["bin"], "--tokenizer", tok, "-o", tok), "is the input")
    assert sha(tok) == old


def test_convert_hf_same_folder_refused(kvllm, hf_model):
    before = tree(hf_model)
    refused(run_cli(kvllm, "convert", hf_model, "--to", "hf", "-o", hf_model), "is the input")
    assert tree(hf_model) == before


def test_convert_hf_into_input_folder_refused(kvllm, gguf_model):
    before = tree(gguf_model.parent)
    refused(run_cli(kvllm, "convert", gguf_model, "--to", "hf", "-o", gguf_model.parent), "holds the input")
    assert tree(gguf_model.parent) == before


def test_quantize_same_file_refused(kvllm, gguf_model):
    before = tree(gguf_model.parent)
    os.link(gguf_model, gguf_model.parent / "hard.gguf")
    refused(run_cli(kvllm, "quantize", gguf_model, gguf_model, "Q8_0"), "is the input")
    refused(run_cli(kvllm, "quantize", gguf_model, gguf_model.parent / "hard.gguf", "Q8_0"), "is the input")
    after = tree(gguf_model.parent)
    assert after.pop("hard.gguf") == before["x.gguf"]
    assert after == before


# ---- an output that is not a regular file (a folder, for --to hf) is refused ------

def not_regular_outputs(tmp_path: Path) -> list[tuple[Path, str]]:
    """A FIFO, a folder and, where this process may make one, a character device like /dev/null (in tmp_path:
    a writer that replaced it replaces a copy, never the machine's)."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    outs = [(tmp_path / "fifo", "a FIFO"), (tmp_path / "dir", "a folder")]
    try:
        os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        outs.append((tmp_path / "null", "a character device"))
    except OSError:
        pass
    return outs


@pytest.mark.parametrize("writer", ["convert", "quantize"])
def test_output_not_a_regular_file_refused(kvllm, gguf_model, tmp_path, writer):
    """`-o /dev/full` (or /dev/null, as root) renamed a regular file over the device node and exited 0: an
    output that exists and is not a regular file is refused, and left as it was."""
    args = {"convert": lambda out: ["convert", gguf_model, "-o", out],
            "quantize": lambda out: ["quantize", gguf_model, out, "Q8_0"]}[writer]
    for out, kind in not_regular_outputs(tmp_path):
        before = os.lstat(out)
        refused(run_cli(kvllm, *args(out)), f"is {kind}")
        after = os.lstat(out)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), out


def test_hf_output_not_a_folder_refused(kvllm, gguf_model, tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"keep")
    refused(run_cli(kvllm, "convert", gguf_model, "--to", "hf", "-o", f), "is a regular file")
    assert f.read_bytes() == b"keep"


def test_failed_hf_write_leaves_no_folder(kvllm, gguf_model, tmp_path):
    """convert --to hf that fails on a full disk (EFBIG here) left the empty folder it had made."""
    d = tmp_path / "new-hf"
    res = run_limited(kvllm, "convert", gguf_model, "--to", "hf", "-o", d, kill=False)
    assert res.returncode == 1, res.stderr.decode()[-2000:]
    assert not d.exists(), list(d.iterdir())


# ---- an interrupted write leaves the old target intact --------------------------

WRITERS = {
    "convert": lambda src, dst: ["convert", src, "-o", dst],
    "quantize": lambda src, dst: ["quantize", src, dst, "F32"],
}


@pytest.mark.parametrize("kill", [True, False], ids=["killed", "efbig"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_interrupted_gguf_write_keeps_old_file(kvllm, gguf_model, tmp_path, writer, kill):
    d = tmp_path / "out"
    d.mkdir()
    target = d / "old.gguf"
    target.write_bytes(b"the old file, which must survive\n" * 100)
    old = sha(target)
    r = run_limited(kvllm, *WRITERS[writer](gguf_model, target), kill=kill)
    if kill:
        assert r.returncode == -signal.SIGXFSZ, r.stderr.decode()
    else:
        assert r.returncode == 1, r.stderr.decode()
        assert "write failed" in r.stderr.decode() or "File too large" in r.stderr.decode(), r.stderr.decode()
    assert sha(target) == old, f"{writer}: the target was changed by an interrupted write"
    left = sorted(p.name for p in d.iterdir())
    if kill:  # a killed process cannot clean up: at most its hidden temporary file remains
        assert all(n == "old.gguf" or n.startswith(".old.gguf.tmp-") for n in left), left
    else:
        assert left == ["old.gguf"], f"stray files after a failed write: {left}"
    # and without the limit the same command replaces the file whole
    run_cli(kvllm, *WRITERS[writer](gguf_model, target)).check_ok()
    assert target.stat().st_size > 10 * LIMIT and target.read_bytes()[:4] == b"GGUF"


@pytest.mark.parametrize("kill", [True, False], ids=["killed", "efbig"])
def test_interrupted_hf_write_keeps_old_folder(kvllm, gguf_model, hf_model, tmp_path, kill):
    """convert --to hf over an existing folder: every file there stays as it was."""
    before = tree(hf_model)
    src = tmp_path / "src.gguf"
    run_cli(kvllm, "convert", gguf_model, "-o", src).check_ok()
    r = run_limited(kvllm, "convert", src, "--to", "hf", "-o", hf_model, kill=kill)
    assert r.returncode == (-signal.SIGXFSZ if kill else 1), r.stderr.decode()
    after = tree(hf_model)
    if kill:
        after = {k: v for k, v in after.items() if not k.startswith(".model.safetensors.tmp-")}
    assert after == before, "an interrupted convert --to hf changed the folder"


def test_write_keeps_mode_and_replaces_whole(kvllm, gguf_model, tmp_path):
    """A completed write replaces the target (same bytes as a fresh write) and keeps its permission bits."""
    fresh = tmp_path / "fresh.gguf"
    run_cli(kvllm, "convert", gguf_model, "-o", fresh).check_ok()
    target = tmp_path / "t.gguf"
    target.write_bytes(b"x" * (3 * 1024 * 1024))  # longer than the new file: no tail may remain
    target.chmod(0o640)
    run_cli(kvllm, "convert", gguf_model, "-o", target).check_ok()
    assert sha(target) == sha(fresh)
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_write_through_symlink_keeps_link(kvllm, gguf_model, tmp_path):
    """A target that is a symbolic link stays one; the file it points to gets the new bytes."""
    real = tmp_path / "real.gguf"
    real.write_bytes(b"old")
    link = tmp_path / "link.gguf"
    os.symlink(real.name, link)
    run_cli(kvllm, "convert", gguf_model, "-o", link).check_ok()
    assert link.is_symlink() and sha(real) == sha(gguf_model)
