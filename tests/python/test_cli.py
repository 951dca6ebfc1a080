"""The kvllm command line: help, context limits, sampling determinism, -q, --no-echo,
--no-kv-cache, option errors (on stories260K, which is tiny and trained)."""
from __future__ import annotations

import pytest

from kvtest import parse_ids

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def m(stories) -> list:
    return ["-m", stories["bin"], "--tokenizer", stories["tok"]]


@pytest.mark.parametrize("sub", ["run", "info", "convert", "tokenize", "eval"])
def test_help(run, sub):
    res = run(sub, "--help")
    assert res.returncode == 0, res.describe()
    assert "usage" in res.out.lower(), f"usage text expected on stdout:\n{res.describe()}"
    assert sub in res.out, res.describe()


def test_docs_options_reference_matches_tables(run):
    """docs/CLI.md's options reference is what the option tables say (scripts/cli-docs.sh rewrites it)."""
    from kvtest import REPO
    doc = (REPO / "docs" / "CLI.md").read_text()
    begin, end = "<!-- options:begin -->\n", "<!-- options:end -->"
    assert begin in doc and end in doc
    section = doc.split(begin, 1)[1].split(end, 1)[0]
    want = run("help", "--markdown").check_ok().out
    assert section == want, "docs/CLI.md's options reference is stale: run scripts/cli-docs.sh"


@pytest.mark.parametrize("cmd", ["run", "chat", "serve"])
def test_help_lines_come_from_the_table(run, cmd):
    """--help and the reference read one table: every spelling the reference lists for the command shows in its
    --help, and --opt=value is --opt value."""
    import re
    ref = run("help", "--markdown").check_ok().out
    part = re.split(r"^### ", ref.split(f"### `kvllm {cmd}`", 1)[1], flags=re.M)[0]
    helptext = run(cmd, "--help").check_ok().out
    rows = re.findall(r"^\| (`[^|]*`(?:, `[^|]*`)*) \|", part, re.M)
    assert len(rows) > 25, rows
    for names in rows:
        for name in re.findall(r"`([^`]+)`", names):
            assert re.search(rf"(^|[ ,]){re.escape(name)}([ ,]|$)", helptext, re.M), name
    assert run(cmd, "--ctx-size=8", "--help").out == run(cmd, "--ctx-size", "8", "--help").out == helptext


# the commands whose options are tables (cli_opts.h), each a section of the reference
TABLE_COMMANDS = {"run", "chat", "serve", "bench model", "bench throughput", "bench prefix", "bench serve",
                  "bench membw", "bench plot", "info", "tokenize", "quantize", "convert", "eval", "batch",
                  "template", "grammar"}


def test_every_reference_section_is_its_help(run):
    """Each command's section of the reference and its --help come from one table: every spelling the section
    lists shows in `kvllm CMD --help`, and every option line of that --help is in the section."""
    import re
    ref = run("help", "--markdown").check_ok().out
    parts = re.split(r"^### `kvllm ([a-z ]+)`$", ref, flags=re.M)[1:]
    sections = dict(zip(parts[::2], parts[1::2]))
    assert set(sections) == TABLE_COMMANDS, sorted(sections)
    for cmd, part in sections.items():
        helptext = run(*cmd.split(), "--help").check_ok().out
        listed = set()
        for names in re.findall(r"^\| (`[^|]*`(?:, `[^|]*`)*) \|", part, re.M):
            for name in re.findall(r"`([^`]+)`", names):
                listed.add(name)
                assert re.search(rf"(^|[ ,]){re.escape(name)}([ ,]|$)", helptext, re.M), (cmd, name)
        # an option line of --help: two spaces, then a spelling
        for line in helptext.splitlines():
            m = re.match(r"^  (-[-\w]+)[ ,]", line)
            if m:
                assert m.group(1) in listed, (cmd, line)


def test_unknown_subcommand(run):
    res = run("no-such-command")
    assert res.returncode in (1, 2), res.describe()
    assert "no-such-command" in res.err, res.describe()


@pytest.mark.parametrize("bad", [["-n", "abc"], ["--temp", "-1"], ["--top-p", "2"], ["--bogus-option"], ["-n"]])
def test_bad_option(run, m, bad):
    res = run("run", *m, *bad, "-q")
    assert res.returncode in (1, 2), res.describe()
    assert "kvllm: error:" in res.err, res.describe()
    assert res.out == "", "nothing may be generated after an option error"


def test_context_overflow_refused(run, m):
    res = run("run", *m, "-p", PROMPT, "-n", "600")
    assert res.returncode == 1, res.describe()
    errs = [ln for ln in res.err.splitlines() if ln.startswith("kvllm: error:")]
    assert len(errs) == 1, res.describe()
    assert "512" in errs[0], f"the error should give the context size 512: {errs[0]!r}"
    assert "600" in errs[0] or "60" in errs[0], f"the error should give the requested numbers: {errs[0]!r}"
    assert res.out == "", "refused before any work: nothing on stdout"


def test_context_option_limits_generation(run, m):
    res = run("run", *m, "-c", "32", "-p", PROMPT, "-n", "40")
    assert res.returncode == 1, res.describe()
    errs = [ln for ln in res.err.splitlines() if ln.startswith("kvllm: error:")]
    assert len(errs) == 1 and "32" in errs[0], res.describe()
    assert res.out == ""
    ok = run("run", *m, "-c", "32", "-p", PROMPT, "-n", "20", "--ids", "--ignore-eos", "-q")
    assert ok.returncode == 0 and len(parse_ids(ok.out)) == 20, ok.describe()


@pytest.mark.parametrize("tokens", ["1 512", "1 -3", "1 abc", ""])
def test_eval_bad_tokens(kvllm, kvllm_asan, stories, tmp_path, tokens):
    """Token ids outside [0, n_vocab) or not numbers: an error, not a crash (release and ASan)."""
    from kvtest import assert_no_sanitizer, run_cli
    for b in filter(None, (kvllm, kvllm_asan)):
        res = run_cli(b, "eval", "-m", stories["bin"], "--tokens", tokens, "-o", tmp_path / "l.bin")
        assert_no_sanitizer(res)
        assert res.returncode in (1, 2), res.describe()
        assert len([ln for ln in res.err.splitlines() if ln.startswith("kvllm: error:")]) == 1, res.describe()


def test_convert_errors(run, stories, tmp_path):
    res = run("convert", tmp_path / "missing.bin", "--tokenizer", stories["tok"], "-o", tmp_path / "o.gguf")
    assert res.returncode == 1 and "missing.bin" in res.err and "kvllm: error:" in res.err, res.describe()
    bad_out = tmp_path / "no_such_dir" / "o.gguf"
    res = run("convert", stories["bin"], "--tokenizer", stories["tok"], "-o", bad_out)
    assert res.returncode == 1 and "no_such_dir" in res.err and "kvllm: error:" in res.err, res.describe()
    assert not bad_out.exists()


def test_context_beyond_training_warns(run, m):
    res = run("run", *m, "-c", "1024", "-n", "8", "--temp", "0", "--ids", "--ignore-eos")
    assert res.returncode == 0, res.describe()
    assert "context" in res.err.lower(), f"expected a warning about the context:\n{res.describe()}"
    assert len(parse_ids(res.out)) == 8


def test_quiet_stderr_empty(run, m):
    res = run("run", *m, "-p", PROMPT, "-n", "16", "--seed", "7", "-q")
    assert res.returncode == 0, res.describe()
    assert res.stderr == b"", f"-q: stderr should be empty, got {res.err!r}"
    assert res.out.startswith(PROMPT) and res.out.endswith("\n")
    noq = run("run", *m, "-p", PROMPT, "-n", "16", "--seed", "7")
    assert noq.returncode == 0 and noq.out == res.out, "-q changes stderr only"


def test_echo_and_no_echo(run, m):
    echo = run("run", *m, "-p", PROMPT, "-n", "24", "--temp", "0", "-q")
    quiet = run("run", *m, "-p", PROMPT, "-n", "24", "--temp", "0", "--no-echo", "-q")
    assert echo.returncode == 0 and quiet.returncode == 0, echo.describe() + quiet.describe()
    assert echo.out == PROMPT + quiet.out, f"echo {echo.out!r} vs no-echo {quiet.out!r}"
    assert len(quiet.out.strip()) > 0 and quiet.out.endswith("\n") and not quiet.out.endswith("\n\n")


def test_ids_output_format(run, m):
    res = run("run", *m, "-p", PROMPT, "-n", "10", "--temp", "0", "--ids", "--ignore-eos", "-q")
    assert res.returncode == 0, res.describe()
    ids = parse_ids(res.out)
    assert len(ids) == 10 and all(0 <= i < 512 for i in ids)
    assert res.out == " ".join(map(str, ids)) + "\n"


def _ids(run, m, *args) -> list[int]:
    res = run("run", *m, "-n", "32", "--ids", "--ignore-eos", "-q", *args)
    assert res.returncode == 0, res.describe()
    ids = parse_ids(res.out)
    assert len(ids) == 32, res.describe()
    return ids


def test_seeded_sampling(run, m):
    a = _ids(run, m, "--temp", "1", "--seed", "42")
    b = _ids(run, m, "--temp", "1", "--seed", "42")
    assert a == b, "same seed must give the same ids"
    others = [_ids(run, m, "--temp", "1", "--seed", str(s)) for s in (1, 2, 3)]
    assert any(o != a for o in others), "different seeds at temperature 1 gave identical ids every time"
    greedy = _ids(run, m, "--temp", "0")
    assert any(o != greedy for o in [a] + others), "temperature 1 sampling always equals greedy"


def test_filters_reduce_to_greedy(run, m):
    """top-k 1 (or a tiny top-p) at temperature 1 can only pick the argmax."""
    greedy = _ids(run, m, "--temp", "0")
    assert _ids(run, m, "--temp", "1", "--top-k", "1", "--seed", "7") == greedy
    assert _ids(run, m, "--temp", "1", "--top-p", "0.000001", "--seed", "7") == greedy


def test_all_sampling_options(run, m):
    ids = _ids(run, m, "--temp", "0.8", "--top-k", "40", "--top-p", "0.9", "--min-p", "0.05",
               "--repeat-penalty", "1.1", "--seed", "3", "-t", "2")
    assert all(0 <= i < 512 for i in ids)


def test_no_kv_cache_same_greedy(run, m, stories):
    want = parse_ids(stories["ids"].read_text())[:64]
    res = run("run", *m, "-n", "64", "--temp", "0", "--ids", "-q")
    nc = run("run", *m, "-n", "64", "--temp", "0", "--ids", "-q", "--no-kv-cache")
    assert res.returncode == 0 and nc.returncode == 0, res.describe() + nc.describe()
    assert parse_ids(res.out) == want
    assert parse_ids(nc.out) == want, "--no-kv-cache must give the same greedy ids"


def test_thread_counts_same_greedy(run, m):
    assert _ids(run, m, "--temp", "0", "-t", "1") == _ids(run, m, "--temp", "0", "-t", "2")
