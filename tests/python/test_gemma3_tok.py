"""Gemma 3's tokenizer and chat template, on the real file (gemma-3-270m-q4_k_m.gguf, fixture gemma3).

Tokenizer: tests/golden/tok-gemma3/gemma-3-270m.json holds what llama.cpp (llama-cpp-python, vocab_only)
made of a fixed corpus, written by scripts/golden-tok-llamacpp.py; CI has no llama.cpp, the golden is what
it checks.  Each case: `kvllm tokenize --ids` against llama_tokenize(add_special=True, parse_special=False),
with --parse-special against parse_special=True, and `--decode` of the latter against llama_detokenize
(control tokens print nothing).  Gemma's vocabulary has user-defined tokens for runs of up to 31 spaces,
tabs and newlines and for HTML tags (matched in any text, as llama.cpp does), control tokens for chat turns,
byte fallback, and no space prefix.

Chat template: the file carries none, so kvllm uses Gemma 3's official one (chat_template_builtin), for
gemma2 files too; `kvllm template -m` on random gemma3 and gemma2 files without a template must render as
Jinja2 renders Transformers' text of it, and the real file must get it with its own <bos>.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gemma3 import gemma3  # noqa: F401  (the fixture)
from gen_model import TOKEN_BOS, TOKEN_EOS, ModelConfig, make_vocab, write_model
from jinja_ref import ENV
from kvtest import run_cli
from test_chat_template import CONVERSATIONS
from tok_golden import (case_params, check_case, check_decode, check_decode_one, check_well_formed,
                        known_decode_params, load)

DOC = load("tok-gemma3/gemma-3-270m.json")
CASES = DOC["cases"]

# Where kvllm follows Gemma's own tokenizer instead of llama.cpp, by token id -> why.  Each case holding one of
# them is an xfail(strict=True): should kvllm come to agree, the XPASS fails and the entry goes.
END_S = ("'</s>' (id 212) is one of Gemma's HTML-tag user-defined tokens, matched in any text by SentencePiece and "
         "Transformers alike; llama.cpp turns every token spelled '</s>' into a control end-of-generation token "
         "(for PaddleOCR), so without parse_special it spells the tag out and it decodes to nothing")
KNOWN_MISMATCHES: dict[int, str] = {212: END_S}

# chat_template of google/gemma-3-270m-it (tokenizer_config.json), as Transformers renders it
GEMMA3_IT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


def test_golden_well_formed():
    check_well_formed(DOC, "repo:models/gemma3/gemma-3-270m-q4_k_m.gguf", 130, 1000, KNOWN_MISMATCHES)
    texts = [c["text"] for c in CASES]
    for must in ("", "<start_of_turn>", "<end_of_turn>", "<bos>", "\t" * 31, "\n" * 45, " " * 70):
        assert must in texts, repr(must)
    for c in CASES:
        assert c["ids"][:1] == [2] and c["ids_special"][:1] == [2], c["text"]  # BOS, as the vocabulary asks


@pytest.mark.parametrize("idx", case_params(DOC, KNOWN_MISMATCHES))
def test_tokenize_matches_llamacpp(run, gemma3, tmp_path, idx):
    check_case(run, gemma3, CASES[idx], tmp_path)


def test_decode_matches_llamacpp(run, gemma3):
    check_decode(run, gemma3, DOC, KNOWN_MISMATCHES)


@pytest.mark.parametrize("token", known_decode_params(KNOWN_MISMATCHES))
def test_decode_known_mismatch(run, gemma3, token):
    check_decode_one(run, gemma3, DOC, token)


# ---- chat template -------------------------------------------------------------

TEMPLATE_CONVERSATIONS = ["system_user", "user_only", "multi_turn", "system_multi_turn", "unicode", "whitespace",
                          "jinja_looking", "empty_content", "system_only", "not_alternating", "tool_message"]


@pytest.fixture(scope="module")
def gemma_random(tmp_path_factory) -> dict[str, tuple[Path, str, str]]:
    """arch -> (a random gemma3 / gemma2 GGUF without a chat template, its BOS piece, its EOS piece)."""
    d = tmp_path_factory.mktemp("gemma")
    tokens = make_vocab(300)[0]
    out = {}
    for arch in ("gemma3", "gemma2"):
        cfg = ModelConfig(arch=arch, n_vocab=300, n_embd=32, n_layer=2, n_head=2, n_head_kv=1, key_length=16,
                          n_ff=64, n_swa=4, tied=True, name=f"{arch}-no-template")
        out[arch] = (write_model(d / f"{arch}.gguf", cfg), tokens[TOKEN_BOS], tokens[TOKEN_EOS])
    return out


def _render(kvllm, model, tmp_path, messages, agp: bool):
    (tmp_path / "m.json").write_text(json.dumps(messages), encoding="utf-8")
    args = ["template", "-m", model, "--messages", tmp_path / "m.json"] + (["--add-generation-prompt"] if agp else [])
    return run_cli(kvllm, *args)


@pytest.mark.parametrize("arch", ["gemma3", "gemma2"])
@pytest.mark.parametrize("conv", TEMPLATE_CONVERSATIONS)
def test_builtin_template_matches_jinja2(kvllm, gemma_random, tmp_path, conv, arch):
    model, bos, eos = gemma_random[arch]
    messages = CONVERSATIONS[conv]
    for agp in (False, True):
        res = _render(kvllm, model, tmp_path, messages, agp)
        try:
            want = ENV.from_string(GEMMA3_IT_TEMPLATE).render(messages=messages, add_generation_prompt=agp,
                                                               bos_token=bos, eos_token=eos)
        except Exception as e:  # noqa: BLE001 - Jinja2 refused: kvllm must refuse too
            assert res.returncode == 1 and res.stdout == b"" and "error" in res.err, (str(e), res.describe())
            continue
        assert res.returncode == 0, res.describe()
        assert res.out == want, f"{conv} agp={agp}\n--- jinja2 ---\n{want!r}\n--- kvllm ---\n{res.out!r}"


def test_builtin_template_real_file(kvllm, gemma3, tmp_path):
    """The real file, with its own <bos>: system text before the first user text, "model" for the assistant."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    res = _render(kvllm, gemma3, tmp_path, messages, True)
    assert res.returncode == 0, res.describe()
    assert res.out == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
                       "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


# ---- end of turn ---------------------------------------------------------------

@pytest.fixture(scope="module")
def says_end_of_turn(tmp_path_factory) -> Path:
    """A random gemma3 file whose vocabulary holds <end_of_turn> (control, id 3) and whose head always picks it."""
    tokens, scores, types = make_vocab(300)
    tokens[3], types[3] = "<end_of_turn>", 3   # in place of the byte token <0x00>; 3 is CONTROL
    emb = np.random.default_rng(0).standard_normal((300, 32)).astype(np.float32) * 0.02
    emb[3] = 5.0
    cfg = ModelConfig(arch="gemma3", n_vocab=300, n_embd=32, n_layer=2, n_head=2, n_head_kv=1, key_length=16,
                      n_ff=64, n_swa=4, tied=True, name="gemma3-says-end-of-turn")
    return write_model(tmp_path_factory.mktemp("eot") / "eot.gguf", cfg, vocab=(tokens, scores, types),
                       tensors={"token_embd.weight": emb})


def test_end_of_turn_ends_generation(run, says_end_of_turn):
    """<end_of_turn> is not Gemma's EOS (<eos>), yet an answer ends there, as llama.cpp ends it; --ignore-eos
    ignores it too."""
    assert run("run", "-m", says_end_of_turn, "-p", "hello", "-n", "6", "--temp", "0", "--ids").check_ok().out == "\n"
    res = run("run", "-m", says_end_of_turn, "-p", "hello", "-n", "6", "--temp", "0", "--ids", "--ignore-eos").check_ok()
    assert res.out.split() == ["3"] * 6


def test_info_tells_builtin_template(run, gemma3, gemma_random):
    """`kvllm info` says the file has no template of its own and which one is used instead."""
    assert "chat template     yes, kvllm's for gemma3 (" in run("info", gemma3).check_ok().out
    j = json.loads(run("info", gemma_random["gemma2"][0], "--json").check_ok().out)
    assert j["chat_template"] is True and j["chat_template_builtin"] is True
