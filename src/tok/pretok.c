/* pretok.c — pre-tokenizer split patterns run with PCRE2 (see pretok.h).
 *
 * The pattern lists are llama.cpp's (llama-vocab.cpp, llm_tokenizer_bpe),
 * which are the Hugging Face tokenizer.json patterns with case-insensitive
 * groups spelled out.  Data, kept as they are so that they can be compared;
 * non-ASCII characters are written as PCRE2 \x{...} escapes, because
 * Unicode normalization of the source would silently change some of them
 * (U+1F7D, U+1FBE, U+2126, U+212A... have singleton decompositions). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tok/pretok.h"
#include "core/core.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PATTERNS 8

/* ---- the pattern lists ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_LLAMA3 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

static const char *const re_default[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]", NULL };
static const char *const re_gpt2[] = { RE_GPT2, NULL };
static const char *const re_llama3[] = { RE_LLAMA3, NULL };
static const char *const re_qwen2[] = { RE_QWEN2, NULL };
static const char *const re_starcoder[] = { "\\p{N}", RE_GPT2, NULL };
static const char *const re_falcon[] = {
    "[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]", NULL };
static const char *const re_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
    "\\p{N}+",
    NULL };
static const char *const re_deepseek_coder[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+", "\\p{N}", NULL };
static const char *const re_deepseek3[] = {
    "\\p{N}{1,3}",
    "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const re_poro[] = { " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+", NULL };
static const char *const re_viking[] = { " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+", "\\p{N}", NULL };
static const char *const re_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const re_chameleon[] = {
    "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2, NULL };
static const char *const re_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACTIONS "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const re_superbpe[] = { "\\p{N}+", "(?=(\\d{3})+(?!\\d))", NULL };
static const char *const re_bailingmoe[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL };
static const char *const re_seed_coder[] = {
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL };

struct pretok_def {
    const char *name;
    const char *const *patterns;
    bool ignore_merges, add_bos;
};

/* Names as llama.cpp's llama_vocab::impl::load maps tokenizer.ggml.pre. */
static const struct pretok_def k_defs[] = {
    { "default", re_default, false, false },
    { "llama3", re_llama3, true, true }, { "llama-v3", re_llama3, true, true },
    { "llama-bpe", re_llama3, true, true }, { "falcon3", re_llama3, true, true },
    { "falcon-h1", re_llama3, true, true }, { "pixtral", re_llama3, true, true },
    { "midm-2.0", re_llama3, true, true }, { "lfm2", re_llama3, true, true },
    { "deepseek-llm", re_deepseek_llm, false, false },
    { "deepseek-coder", re_deepseek_coder, false, false },
    { "deepseek-v3", re_deepseek3, false, false }, { "hunyuan-dense", re_deepseek3, false, false },
    { "falcon", re_falcon, false, false },
    { "mpt", re_gpt2, false, false },
    { "starcoder", re_starcoder, false, false }, { "refact", re_starcoder, false, false },
    { "command-r", re_starcoder, false, false }, { "smollm", re_starcoder, false, false },
    { "codeshell", re_starcoder, false, false }, { "exaone", re_starcoder, false, false },
    { "minerva-7b", re_starcoder, false, false },
    { "gpt-2", re_gpt2, false, false }, { "phi-2", re_gpt2, false, false },
    { "jina-es", re_gpt2, false, false }, { "jina-de", re_gpt2, false, false },
    { "gigachat", re_gpt2, false, false }, { "jina-v2-es", re_gpt2, false, false },
    { "jina-v2-de", re_gpt2, false, false }, { "a.x-4.0", re_gpt2, false, false },
    { "mellum", re_gpt2, false, false }, { "jina-v1-en", re_gpt2, false, false },
    { "jina-v2-code", re_gpt2, false, false }, { "roberta-bpe", re_gpt2, false, false },
    { "exaone4", re_gpt2, false, false }, { "olmo", re_gpt2, false, false },
    { "jais", re_gpt2, false, false }, { "trillion", re_gpt2, false, false },
    { "granite-docling", re_gpt2, false, false },
    { "qwen2", re_qwen2, false, false }, { "deepseek-r1-qwen", re_qwen2, false, false },
    { "kormo", re_qwen2, false, false }, { "megrez", re_qwen2, false, false },
    { "stablelm2", re_qwen2, false, false }, { "hunyuan", re_qwen2, false, false },
    { "dbrx", re_llama3, false, false }, { "smaug-bpe", re_llama3, false, false },
    { "glm4", re_llama3, false, false }, { "chatglm-bpe", re_llama3, false, false },
    { "poro-chat", re_poro, false, false }, { "bloom", re_poro, false, false },
    { "gpt3-finnish", re_poro, false, false },
    { "viking", re_viking, false, false },
    { "tekken", re_tekken, true, true },
    { "chameleon", re_chameleon, false, true },
    { "gpt-4o", re_gpt4o, false, false }, { "llama4", re_gpt4o, false, false },
    { "minimax-m2", re_gpt4o, false, false },
    { "superbpe", re_superbpe, false, false },
    { "bailingmoe", re_bailingmoe, false, false }, { "bailingmoe2", re_bailingmoe, false, false },
    { "llada-moe", re_bailingmoe, false, false },
    { "seed-coder", re_seed_coder, false, false },
};
#define N_DEFS (sizeof k_defs / sizeof k_defs[0])

/* ---- compiled patterns ---- */

struct pretok {
    const char *name;      /* for messages */
    struct pretok_info info;
    pcre2_code *re[MAX_PATTERNS];
    int n_re;
};

void pretok_free(struct pretok *p) {
    if (!p) return;
    for (int i = 0; i < p->n_re; i++) pcre2_code_free(p->re[i]);
    free(p);
}

struct pretok_info pretok_info(const struct pretok *p) { return p->info; }

static const struct pretok_def *find_def(const char *name, size_t n) {
    if (!name) name = "default", n = 7;
    for (size_t i = 0; i < N_DEFS; i++)
        if (strlen(k_defs[i].name) == n && memcmp(k_defs[i].name, name, n) == 0) return &k_defs[i];
    return NULL;
}

/* Compile patterns[0, n) into p (which has none yet). */
static int compile_all(struct pretok *p, const char *what, const char *const *patterns, int n) {
    if (n > MAX_PATTERNS) {
        LOG_ERR("%s: %d patterns, more than %d", what, n, MAX_PATTERNS);
        return KVLLM_EUNSUPPORTED;
    }
    for (int i = 0; i < n; i++) {
        int err;
        PCRE2_SIZE at;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)patterns[i], PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            LOG_ERR("%s: pattern %d does not compile at %zu: %s", what, i, (size_t)at, (const char *)msg);
            return KVLLM_EFORMAT;
        }
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* best effort: the interpreter also works */
        p->re[p->n_re++] = code;
    }
    return 0;
}

int pretok_new(const char *name, size_t n, struct pretok **out) {
    *out = NULL;
    const struct pretok_def *def = find_def(name, n);
    if (!def) return KVLLM_EUNSUPPORTED; /* the caller names it, with its source */
    struct pretok *p = xcalloc(1, sizeof *p);
    if (!p) return KVLLM_ENOMEM;
    p->name = def->name;
    p->info = (struct pretok_info){ def->ignore_merges, def->add_bos };
    int n_re = 0;
    while (def->patterns[n_re]) n_re++;
    char what[64];
    snprintf(what, sizeof what, "pre-tokenizer '%s'", def->name);
    int rc = compile_all(p, what, def->patterns, n_re);
    if (rc) { pretok_free(p); return rc; }
    *out = p;
    return 0;
}

int pretok_new_patterns(const char *what, const char *const *patterns, int n, struct pretok_info info,
                        struct pretok **out) {
    *out = NULL;
    struct pretok *p = xcalloc(1, sizeof *p);
    if (!p) return KVLLM_ENOMEM;
    p->name = "custom";
    p->info = info;
    int rc = compile_all(p, what, patterns, n);
    if (rc) { pretok_free(p); return rc; }
    *out = p;
    return 0;
}

/* ---- splitting ---- */

static int spans_push(struct pretok_spans *s, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        struct pretok_span *v = realloc(s->v, cap * sizeof *v);
        if (!v) { LOG_ERR("out of memory"); return KVLLM_ENOMEM; }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (struct pretok_span){ off, len };
    return 0;
}

/* Matching state of one pretok_split call.  The JIT's default 32 KiB
 * stack suffices for ordinary text; a pathological input (millions of
 * digits under a lookahead) gets a larger one on its first overflow. */
struct matcher {
    pcre2_match_data *md;
    pcre2_match_context *mc;  /* NULL until needed */
    pcre2_jit_stack *stack;
};

#define JIT_STACK_MAX (64u << 20)

static int match_at(struct matcher *m, pcre2_code *re, PCRE2_SPTR subject, size_t len, size_t start) {
    int rc = pcre2_match(re, subject, len, start, 0, m->md, m->mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !m->mc) {
        m->mc = pcre2_match_context_create(NULL);
        m->stack = pcre2_jit_stack_create(32 * 1024, JIT_STACK_MAX, NULL);
        if (!m->mc || !m->stack) return PCRE2_ERROR_NOMEMORY;
        pcre2_jit_stack_assign(m->mc, NULL, m->stack);
        rc = pcre2_match(re, subject, len, start, 0, m->md, m->mc);
    }
    return rc;
}

/* Cut text[off, off + len) by one pattern, appending the pieces to out. */
static int split_one(pcre2_code *re, struct matcher *mt, const char *text, size_t off, size_t len,
                     struct pretok_spans *out) {
    const PCRE2_SPTR subject = (PCRE2_SPTR)(text + off);
    size_t start = 0, last = 0; /* search from start; text before last was emitted */
    int rc = 0;
    while (start <= len && rc == 0) {
        int m = match_at(mt, re, subject, len, start);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            LOG_ERR("pre-tokenizer pattern failed to match: %s", (const char *)msg);
            return KVLLM_EINVAL;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(mt->md);
        size_t b = ov[0], e = ov[1];
        if (e == b) { /* an empty match is a cut point (superbpe's digit groups) */
            if (b > last) rc = spans_push(out, off + last, b - last);
            last = b;
            if (b >= len) break;
            start = b + 1;
            while (start < len && (subject[start] & 0xc0) == 0x80) start++;
            continue;
        }
        if (b > last) rc = spans_push(out, off + last, b - last);
        if (rc == 0) rc = spans_push(out, off + b, e - b);
        last = start = e;
    }
    if (rc == 0 && last < len) rc = spans_push(out, off + last, len - last);
    return rc;
}

int pretok_split(const struct pretok *p, const char *text, size_t len, struct pretok_spans *out) {
    out->n = 0;
    if (len == 0) return 0;
    int rc = spans_push(out, 0, len);
    struct pretok_spans tmp = { 0 };
    struct matcher mt = { 0 };
    for (int i = 0; i < p->n_re && rc == 0; i++) {
        mt.md = pcre2_match_data_create_from_pattern(p->re[i], NULL);
        if (!mt.md) { LOG_ERR("out of memory"); rc = KVLLM_ENOMEM; break; }
        tmp.n = 0;
        for (size_t k = 0; k < out->n && rc == 0; k++)
            rc = split_one(p->re[i], &mt, text, out->v[k].off, out->v[k].len, &tmp);
        pcre2_match_data_free(mt.md);
        struct pretok_spans swap = *out;
        *out = tmp;
        tmp = swap;
    }
    pcre2_match_context_free(mt.mc);
    pcre2_jit_stack_free(mt.stack);
    free(tmp.v);
    return rc;
}
