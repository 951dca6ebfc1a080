/* test_grammar_gbnf.c — llama.cpp's example grammars (arithmetic, c, json,
 * list, chess) and feature grammars against llama.cpp's own verdicts
 * (tests/golden/gbnf/goldens.json, made by make-goldens.py with
 * llama-cpp-python: no llama.cpp needed here), and constrained generation:
 * random walks that only ever pick tokens the mask allows (GPT-2's
 * vocabulary) end in strings the grammar accepts — and, for json.gbnf, that
 * json-c parses. */
#include "check.h"
#include "io_util.h"
#include "grammar_util.h"
#include "core/core.h"

#include <json-c/json.h>


static char golden_dir[1024];

static int accepts(const struct kvllm_grammar *g, const struct gvocab *bytes, const char *s, size_t len) {
    struct gmatcher *m;
    if (gmatcher_new(g, bytes, &m)) return -1;
    int ok = 1;
    for (size_t i = 0; i < len && ok; i++) ok = gmatcher_accept(m, (unsigned char)s[i]) == 0;
    ok = ok && gmatcher_can_end(m);
    gmatcher_free(m);
    return ok;
}

/* Punctuation that tends to finish something (not an opening bracket, not part of a word). */
static bool is_closing(char c) {
    unsigned char u = (unsigned char)c;
    if (u == '\n') return true;
    return u > 0x20 && u < 0x7F && !(u >= '0' && u <= '9') && !(u >= 'a' && u <= 'z') && !(u >= 'A' && u <= 'Z') &&
           u != '_' && u != '{' && u != '[';
}

/* Random constrained generation: returns the number of walks that ended. */
static int generate(const char *name, const struct kvllm_grammar *g, const struct tvocab *tv, const struct gvocab *v,
                    const struct gvocab *bytes, int n_walks, int max_tokens, uint64_t seed) {
    struct rng r;
    rng_seed(&r, seed);
    uint32_t *mask = calloc((size_t)(tv->n + 31) / 32, 4);
    int32_t *allowed = malloc((size_t)tv->n * sizeof *allowed);
    char *text = malloc(1 << 16);
    int ended = 0;
    for (int w = 0; w < n_walks; w++) {
        struct gmatcher *m;
        CHECK(gmatcher_new(g, v, &m) == 0);
        size_t len = 0;
        bool done = false;
        for (int t = 0; t < max_tokens && !done; t++) {
            int n = gmatcher_fill_mask(m, mask);
            CHECK_MSG(n > 0, "%s: walk %d: nothing allowed after %zu bytes '%.*s'", name, w, len, (int)len, text);
            if (n <= 0) break;
            /* late in a walk, half the time, pick among closing single bytes when any is allowed, so that
             * walks head for an end instead of wandering in an identifier or a string */
            bool closing = t > max_tokens / 3 && rng_f32(&r) < 0.5f;
            int k = 0;
            for (int pass = closing ? 0 : 1; pass < 2 && k == 0; pass++)
                for (int i = 0; i < tv->n; i++)
                    if ((mask[i >> 5] >> (i & 31) & 1) &&
                        (pass == 1 || (tv->len[i] == 1 && is_closing(tv->bytes[i][0]))))
                        allowed[k++] = i;
            bool end_ok = mask[tv->end_id >> 5] >> (tv->end_id & 31) & 1;
            /* end with some probability when allowed, growing with length so walks finish */
            if (end_ok && (k == 1 || rng_f32(&r) < 0.15f + (float)t / (float)max_tokens)) {
                CHECK(gmatcher_accept(m, tv->end_id) == 0);
                done = true;
                break;
            }
            int32_t pick;
            do pick = allowed[rng_u64(&r) % (uint64_t)k];
            while (pick == tv->end_id);
            CHECK(gmatcher_accept(m, pick) == 0);
            if (len + tv->len[pick] < (1 << 16)) {
                memcpy(text + len, tv->bytes[pick], tv->len[pick]);
                len += tv->len[pick];
            }
        }
        gmatcher_free(m);
        if (!done && getenv("GDEBUG")) fprintf(stderr, "%s unfinished: %.*s\n", name, (int)(len > 300 ? 300 : len), text + (len > 300 ? len - 300 : 0));
        if (!done) continue;
        ended++;
        CHECK_MSG(accepts(g, bytes, text, len) == 1, "%s: generated text not accepted: '%.*s'", name, (int)len, text);
        if (strstr(name, "json")) {
            json_tokener *tok = json_tokener_new();
            json_object *o = json_tokener_parse_ex(tok, text, (int)len);
            CHECK_MSG(o && json_tokener_get_error(tok) == json_tokener_success,
                      "%s: json-c cannot parse the generated '%.*s'", name, (int)len, text);
            json_object_put(o);
            json_tokener_free(tok);
        }
    }
    free(mask);
    free(allowed);
    free(text);
    return ended;
}

int main(void) {
    snprintf(golden_dir, sizeof golden_dir, "%s", __FILE__);
    char *slash = strrchr(golden_dir, '/');
    if (slash) *slash = 0;
    strncat(golden_dir, "/../golden/gbnf", sizeof golden_dir - strlen(golden_dir) - 1);
    char path[1200];
    snprintf(path, sizeof path, "%s/goldens.json", golden_dir);
    json_object *gold = json_object_from_file(path);
    CHECK_MSG(gold != NULL, "cannot read %s", path);
    if (!gold) return check_report("test_grammar_gbnf");

    struct tvocab syn;
    tvocab_synthetic(&syn);   /* tokens 0..255 are single bytes */
    struct gvocab *bytes;
    CHECK(tvocab_index(&syn, &bytes) == 0);

    struct tvocab gpt2;
    snprintf(path, sizeof path, "%s/tokenizers/gpt2/encoder.json", check_shared_dir());
    bool have_gpt2 = tvocab_gpt2(&gpt2, path);
    CHECK_MSG(have_gpt2, "missing %s (the test data tokenizers)", path);
    struct gvocab *vg = NULL;
    if (have_gpt2) CHECK(tvocab_index(&gpt2, &vg) == 0);

    json_object *grammars, *bad;
    CHECK(json_object_object_get_ex(gold, "grammars", &grammars));
    int n_cases = 0;
    json_object_object_foreach(grammars, fname, cases) {
        snprintf(path, sizeof path, "%s/%s", golden_dir, fname);
        char *text = tu_read_file(path, NULL);
        CHECK_MSG(text != NULL, "cannot read %s", path);
        if (!text) continue;
        struct kvllm_grammar *g = NULL;
        char err[256];
        int rc = kvllm_grammar_from_gbnf(text, &g, err, sizeof err);
        CHECK_MSG(rc == 0, "%s: %s", fname, err);
        free(text);
        if (rc) continue;
        for (size_t i = 0; i < json_object_array_length(cases); i++) {
            json_object *c = json_object_array_get_idx(cases, i), *t, *a;
            json_object_object_get_ex(c, "text", &t);
            json_object_object_get_ex(c, "accept", &a);
            int want = json_object_get_boolean(a);
            int got = accepts(g, bytes, json_object_get_string(t), (size_t)json_object_get_string_len(t));
            CHECK_MSG(got == want, "%s: '%s': kvllm %d, llama.cpp %d", fname, json_object_get_string(t), got, want);
            n_cases++;
        }
        if (vg && strncmp(fname, "features/", 9)) {
            int ended = generate(fname, g, &gpt2, vg, bytes, 12, 400, 7);
            CHECK_MSG(ended >= 3, "%s: only %d of 12 constrained walks ended", fname, ended);
        }
        kvllm_grammar_free(g);
    }
    CHECK_MSG(n_cases >= 100, "only %d golden cases", n_cases);
    CHECK(json_object_object_get_ex(gold, "bad_grammars", &bad));
    json_object_object_foreach(bad, bname, b) {
        json_object *t, *p;
        json_object_object_get_ex(b, "text", &t);
        json_object_object_get_ex(b, "parses", &p);
        struct kvllm_grammar *g = NULL;
        char err[256] = "";
        int rc = kvllm_grammar_from_gbnf(json_object_get_string(t), &g, err, sizeof err);
        CHECK_MSG((rc == 0) == json_object_get_boolean(p), "%s: kvllm rc %d (%s), llama.cpp parses %d", bname, rc, err,
                  json_object_get_boolean(p));
        kvllm_grammar_free(g);
    }
    json_object_put(gold);
    gvocab_free(vg);
    if (have_gpt2) tvocab_free(&gpt2);
    gvocab_free(bytes);
    tvocab_free(&syn);
    return check_report("test_grammar_gbnf");
}
