/* test_quant_policy.c — which tensor gets which type (quant.h), on models built in memory: the
 * Q4_K_M / Q5_K_M mixes as llama-quantize's llama_tensor_get_type decides them (use_more_bits over
 * attn_v and ffn_down, the output in Q6_K, the tied embedding standing in for a missing output), plain
 * targets, the row fallbacks grouped for the summary, already-quantized tensors counted, 1-D tensors
 * left alone, and the conversion the same bytes for 1 and 3 threads. */
#include "check.h"
#include "core/threadpool.h"
#include "load/gguf.h"
#include "quant/quant.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <string.h>

#define N_LAYER 8
static float g_data[768 * 512];   /* large enough for any tensor below; the plan never reads it */

/* A Llama-shaped model of N_LAYER layers; n_ff is ffn_down's row length; tied: no output.weight. */
static struct gguf *build(int n_ff, bool tied, uint32_t type) {
    struct gguf *g = gguf_new("mem.gguf");
    CHECK(g && gguf_set_str(g, "general.architecture", "llama") == 0);
    CHECK(gguf_add_tensor(g, "token_embd.weight", type, 2, (int64_t[]){ 256, 512 }, g_data) == 0);
    char name[64];
    for (int il = 0; il < N_LAYER; il++) {
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", il);
        CHECK(gguf_add_tensor(g, name, DTYPE_F32, 1, (int64_t[]){ 256 }, g_data) == 0);
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", il);
        CHECK(gguf_add_tensor(g, name, type, 2, (int64_t[]){ 256, 256 }, g_data) == 0);
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", il);
        CHECK(gguf_add_tensor(g, name, type, 2, (int64_t[]){ 256, 128 }, g_data) == 0);
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", il);
        CHECK(gguf_add_tensor(g, name, DTYPE_F32, 2, (int64_t[]){ n_ff, 256 }, g_data) == 0);
    }
    if (!tied) CHECK(gguf_add_tensor(g, "output.weight", type, 2, (int64_t[]){ 256, 512 }, g_data) == 0);
    return g;
}

static uint32_t type_of(const struct gguf *g, const struct quant_plan *p, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (gguf_str_eq(g->tensors[i].name, name)) return p->to[i];
    CHECK_MSG(0, "no tensor %s", name);
    return 9999;
}

static void test_mixes(void) {
    static const int more[N_LAYER] = { 1, 0, 0, 1, 0, 0, 1, 1 };   /* use_more_bits(i, 8): 0, 3, 6, 7 */
    for (int m = 0; m < 2; m++) {
        const struct quant_target *t = quant_target_find(m ? "q5_k_m" : "Q4_K_M");
        CHECK(t && t->ftype == (m ? 17u : 15u));
        const uint32_t base = m ? DTYPE_Q5_K : DTYPE_Q4_K;
        struct gguf *g = build(768, false, DTYPE_F32);
        struct quant_plan p;
        CHECK(quant_plan_make(g, t, &p) == 0);
        CHECK(type_of(g, &p, "output.weight") == DTYPE_Q6_K);
        CHECK(type_of(g, &p, "token_embd.weight") == base);
        char name[64];
        for (int il = 0; il < N_LAYER; il++) {
            snprintf(name, sizeof name, "blk.%d.attn_v.weight", il);
            CHECK_MSG(type_of(g, &p, name) == (more[il] ? DTYPE_Q6_K : base), "%s", name);
            snprintf(name, sizeof name, "blk.%d.ffn_down.weight", il);
            CHECK_MSG(type_of(g, &p, name) == (more[il] ? DTYPE_Q6_K : base), "%s", name);
            snprintf(name, sizeof name, "blk.%d.attn_q.weight", il);
            CHECK(type_of(g, &p, name) == base);
            snprintf(name, sizeof name, "blk.%d.attn_norm.weight", il);
            CHECK(type_of(g, &p, name) == DTYPE_F32);
        }
        CHECK(p.n_fb == 0 && p.n_requant == 0 && p.n_quantized == 3 * N_LAYER + 2);
        quant_plan_free(&p);
        quant_plan_free(&p);   /* idempotent */
        gguf_free(g);
    }
    /* tied: the token embedding is the output, so it takes the output's type */
    struct gguf *g = build(768, true, DTYPE_F32);
    struct quant_plan p;
    CHECK(quant_plan_make(g, quant_target_find("Q4_K_M"), &p) == 0);
    CHECK(type_of(g, &p, "token_embd.weight") == DTYPE_Q6_K);
    quant_plan_free(&p);
    gguf_free(g);
}

static void test_plain_and_fallbacks(void) {
    /* ffn_down rows of 672: a multiple of 32, not of 256: Q4_K falls back to Q5_0 (8 tensors, one group) */
    struct gguf *g = build(672, false, DTYPE_F32);
    struct quant_plan p;
    CHECK(quant_plan_make(g, quant_target_find("Q4_K"), &p) == 0);
    CHECK(type_of(g, &p, "blk.0.ffn_down.weight") == DTYPE_Q5_0);
    CHECK(type_of(g, &p, "blk.0.attn_v.weight") == DTYPE_Q4_K && type_of(g, &p, "output.weight") == DTYPE_Q4_K);
    CHECK(p.n_fb == N_LAYER && p.n_fb_groups == 1 && p.fb[0].n == N_LAYER && p.fb[0].ne0 == 672);
    CHECK(p.fb[0].want == DTYPE_Q4_K && p.fb[0].to == DTYPE_Q5_0 && !strcmp(p.fb[0].first, "blk.0.ffn_down.weight"));
    quant_plan_free(&p);
    gguf_free(g);
    /* rows of 200 fit no 32-element block: F16 */
    g = build(200, false, DTYPE_F32);
    CHECK(quant_plan_make(g, quant_target_find("Q8_0"), &p) == 0);
    CHECK(type_of(g, &p, "blk.7.ffn_down.weight") == DTYPE_F16 && type_of(g, &p, "blk.7.attn_q.weight") == DTYPE_Q8_0);
    quant_plan_free(&p);
    gguf_free(g);
    /* an already-quantized source: counted (the CLI refuses it without --allow-requantize) */
    static uint8_t q8[512 * 256 / 32 * 34];
    g = gguf_new("q8.gguf");
    CHECK(gguf_add_tensor(g, "a.weight", DTYPE_Q8_0, 2, (int64_t[]){ 256, 512 }, q8) == 0);
    CHECK(gguf_add_tensor(g, "b.weight", DTYPE_Q8_0, 2, (int64_t[]){ 256, 512 }, q8) == 0);
    CHECK(quant_plan_make(g, quant_target_find("Q4_0"), &p) == 0);
    CHECK(p.n_requant == 2 && strstr(p.first_requant, "a.weight (Q8_0 -> Q4_0)"));
    quant_plan_free(&p);
    CHECK(quant_plan_make(g, quant_target_find("Q8_0"), &p) == 0);   /* already there: copied, no requant */
    CHECK(p.n_requant == 0 && p.n_quantized == 0);
    quant_plan_free(&p);
    gguf_free(g);
    CHECK(quant_target_find("Q9_9") == NULL);
    char names[256];
    quant_target_names(names, sizeof names);
    CHECK(strstr(names, "Q4_K_M") && strstr(names, "MXFP4"));
}

/* the converted bytes do not depend on the thread count */
static void test_threads(void) {
    for (size_t i = 0; i < sizeof g_data / sizeof *g_data; i++) g_data[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1;
    struct gguf *src = build(768, false, DTYPE_F32), *out[2];
    const struct quant_target *t = quant_target_find("Q4_K_M");
    struct quant_plan p;
    CHECK(quant_plan_make(src, t, &p) == 0);
    for (int k = 0; k < 2; k++) {
        struct threadpool *pool = threadpool_new(k ? 3 : 1);
        out[k] = gguf_new("out.gguf");
        CHECK(pool && out[k] && quant_model(src, t, &p, pool, out[k], NULL, NULL) == 0);
        threadpool_free(pool);
    }
    CHECK(out[0]->n_tensors == src->n_tensors && out[1]->n_tensors == src->n_tensors);
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        CHECK(out[0]->tensors[i].type == p.to[i] && out[0]->tensors[i].n_bytes == out[1]->tensors[i].n_bytes);
        CHECK(!memcmp(out[0]->tensors[i].data, out[1]->tensors[i].data, out[0]->tensors[i].n_bytes));
    }
    uint32_t ft = 0;
    CHECK(gguf_get_u32(out[0], "general.file_type", &ft) == 0 && ft == 15);
    quant_plan_free(&p);
    gguf_free(out[0]);
    gguf_free(out[1]);
    gguf_free(src);
}

int main(void) {
    test_mixes();
    test_plain_and_fallbacks();
    test_threads();
    return check_report("test_quant_policy");
}
