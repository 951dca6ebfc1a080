/* quant.c — rewriting a GGUF model's weights in another type (quant.h). */
#include "quant/quant.h"
#include "core/core.h"
#include "core/threadpool.h"
#include "load/gguf.h"
#include "tensor/dtype.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- the targets ---- */

static const struct quant_target k_targets[] = {
    { "F32",    DTYPE_F32,  0,  QUANT_MIX_NONE },
    { "F16",    DTYPE_F16,  1,  QUANT_MIX_NONE },
    { "BF16",   DTYPE_BF16, 32, QUANT_MIX_NONE },
    { "Q8_0",   DTYPE_Q8_0, 7,  QUANT_MIX_NONE },
    { "Q4_0",   DTYPE_Q4_0, 2,  QUANT_MIX_NONE },
    { "Q4_1",   DTYPE_Q4_1, 3,  QUANT_MIX_NONE },
    { "Q5_0",   DTYPE_Q5_0, 8,  QUANT_MIX_NONE },
    { "Q5_1",   DTYPE_Q5_1, 9,  QUANT_MIX_NONE },
    { "Q2_K",   DTYPE_Q2_K, 10, QUANT_MIX_NONE },
    { "Q3_K",   DTYPE_Q3_K, 11, QUANT_MIX_NONE },
    { "Q4_K",   DTYPE_Q4_K, 14, QUANT_MIX_NONE },
    { "Q5_K",   DTYPE_Q5_K, 16, QUANT_MIX_NONE },
    { "Q6_K",   DTYPE_Q6_K, 18, QUANT_MIX_NONE },
    { "IQ4_NL", DTYPE_IQ4_NL, 25, QUANT_MIX_NONE },
    { "IQ4_XS", DTYPE_IQ4_XS, 30, QUANT_MIX_NONE },
    { "MXFP4",  DTYPE_MXFP4, 38, QUANT_MIX_NONE },
    { "Q4_K_M", DTYPE_Q4_K, 15, QUANT_MIX_Q4_K_M },
    { "Q5_K_M", DTYPE_Q5_K, 17, QUANT_MIX_Q5_K_M },
};

const struct quant_target *quant_target_find(const char *name) {
    for (size_t i = 0; i < sizeof k_targets / sizeof *k_targets; i++)
        if (!strcasecmp(name, k_targets[i].name)) return &k_targets[i];
    return NULL;
}

void quant_target_names(char *out, size_t cap) {
    size_t n = 0;
    if (cap) out[0] = 0;
    for (size_t i = 0; i < sizeof k_targets / sizeof *k_targets && n < cap; i++) {
        int w = snprintf(out + n, cap - n, "%s%s", i ? " " : "", k_targets[i].name);
        if (w < 0) break;
        n += (size_t)w;
    }
}

/* ---- the policy: which tensor gets which type ---- */

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Would llama-quantize quantize this tensor at all?  Dimensions count as
 * ggml_n_dims does: trailing sizes of 1 do not make a matrix. */
static bool quantizable(const char *name, const struct gguf_tensor *t) {
    uint32_t n_dims = 1;
    for (uint32_t d = 1; d < t->n_dims; d++)
        if (t->ne[d] > 1) n_dims = d + 1;
    return n_dims >= 2 && ends_with(name, "weight") && !strstr(name, "ffn_gate_inp.weight") &&
           !strstr(name, "pos_embd") && !strstr(name, "token_types");
}

static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* State of the mix rules while walking the tensors in file order. */
struct mix_state {
    bool has_output;
    int n_attn_v, i_attn_v, n_ffn_down, i_ffn_down;
};

/* llama_tensor_get_type for the Q4_K_M / Q5_K_M mixes (Llama-style, no experts). */
static uint32_t mix_type(enum quant_mix mix, uint32_t base, const char *name, struct mix_state *ms) {
    if (mix == QUANT_MIX_NONE) return base;
    if (!strcmp(name, "output.weight") || (!ms->has_output && !strcmp(name, "token_embd.weight")))
        return DTYPE_Q6_K;   /* Q8_0 when the row does not fit: fallback_type */
    if (strstr(name, "attn_v.weight")) {
        bool more = use_more_bits(ms->i_attn_v++, ms->n_attn_v);
        return more ? DTYPE_Q6_K : base;
    }
    if (strstr(name, "ffn_down")) {
        bool more = use_more_bits(ms->i_ffn_down++, ms->n_ffn_down);
        return more ? DTYPE_Q6_K : base;
    }
    if (strstr(name, "attn_qkv.weight")) return mix == QUANT_MIX_Q4_K_M ? DTYPE_Q5_K : DTYPE_Q6_K;
    return base;
}

/* The type a row of ne0 elements can really take when `want` does not fit. */
static uint32_t fallback_type(uint32_t want, int64_t ne0) {
    uint32_t t = want == DTYPE_Q4_K ? DTYPE_Q5_0 : want == DTYPE_Q5_K ? DTYPE_Q5_1 : want == DTYPE_Q6_K ? DTYPE_Q8_0
               : want == DTYPE_Q2_K || want == DTYPE_Q3_K || want == DTYPE_IQ4_XS ? DTYPE_IQ4_NL : DTYPE_F16;
    return ne0 % dtype_block_elems(t) ? DTYPE_F16 : t;
}

/* ---- the plan: every tensor's output type, decided before any work ---- */

static bool is_block_type(uint32_t type) { return dtype_supported(type) && dtype_block_elems(type) > 1; }

static int plan_walk(const struct gguf *src, const char *in, const struct quant_target *target, struct quant_plan *p) {
    /* the mix rules count attn_v / ffn_down tensors first, as llama-quantize does */
    struct mix_state ms = { 0 };
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const struct gguf_tensor *t = &src->tensors[i];
        if (gguf_str_eq(t->name, "output.weight")) ms.has_output = true;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(t->name.len < 255 ? t->name.len : 255), t->name.ptr);
        if (strstr(name, "attn_v.weight") || strstr(name, "attn_qkv.weight")) ms.n_attn_v++;
        if (strstr(name, "ffn_down")) ms.n_ffn_down++;
    }
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const struct gguf_tensor *t = &src->tensors[i];
        if (t->name.len >= 256) { LOG_ERR("%s: tensor name too long", in); return KVLLM_EFORMAT; }
        char name[256];
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = 0;
        const int64_t ne0 = t->ne[0];
        uint32_t to = t->type;
        if (quantizable(name, t)) {
            uint32_t want = mix_type(target->mix, target->type, name, &ms);
            to = ne0 % dtype_block_elems(want) ? fallback_type(want, ne0) : want;
            if (to != want) {
                p->n_fb++;
                int g = 0;
                while (g < p->n_fb_groups && !(p->fb[g].want == want && p->fb[g].to == to && p->fb[g].ne0 == ne0)) g++;
                if (g == p->n_fb_groups && g < QUANT_MAX_FALLBACK_GROUPS) {
                    p->fb[g] = (struct quant_fallback){ .want = want, .to = to, .ne0 = ne0 };
                    snprintf(p->fb[g].first, sizeof p->fb[g].first, "%s", name);
                    p->n_fb_groups++;
                }
                if (g < p->n_fb_groups) p->fb[g].n++;
                else p->n_fb_other++;
            }
        }
        p->to[i] = to;
        if (to == t->type) continue;
        if (!dtype_supported(t->type)) {
            LOG_ERR("%s: tensor '%s' has type %s, which kvllm cannot read", in, name, dtype_name(t->type));
            return KVLLM_EUNSUPPORTED;
        }
        if (is_block_type(t->type) || is_block_type(to)) p->n_quantized++;
        if (is_block_type(t->type) && p->n_requant++ == 0)
            snprintf(p->first_requant, sizeof p->first_requant, "%s (%s -> %s)", name, dtype_name(t->type),
                     dtype_name(to));
    }
    return 0;
}

int quant_plan_make(const struct gguf *src, const struct quant_target *target, struct quant_plan *p) {
    *p = (struct quant_plan){ 0 };
    const char *in = src->path;
    if (!(p->to = xcalloc(src->n_tensors ? src->n_tensors : 1, sizeof *p->to))) return KVLLM_ENOMEM;
    int rc = plan_walk(src, in, target, p);
    if (rc) quant_plan_free(p);
    return rc;
}

void quant_plan_free(struct quant_plan *p) {
    if (!p) return;
    free(p->to);
    p->to = NULL;
}

/* ---- the conversion: rows in chunks over the pool ---- */

/* Rows per chunk: about 64K elements, so that a chunk is a few milliseconds
 * of work and threads the OS delays do not hold the others up.  A row's
 * bytes depend on that row alone, so the output does not depend on which
 * thread did which chunk, or on the thread count. */
#define CHUNK_ELEMS 65536

struct conv_job {
    const uint8_t *src;   /* (n_rows, in_rb) of in_type */
    uint8_t *dst;         /* (n_rows, out_rb) of out_type */
    uint32_t in_type, out_type;
    int64_t ne0, n_rows, rows_per_chunk;
    size_t in_rb, out_rb;
    float *buf;           /* (nth, ne0) */
    int64_t *bad_row;     /* (nth): smallest row with a non-finite value seen by that thread, or -1 */
};

static void conv_chunk(void *arg, long c, int ith) {
    struct conv_job *j = arg;
    const int64_t r0 = (int64_t)c * j->rows_per_chunk;
    const int64_t r1 = r0 + j->rows_per_chunk < j->n_rows ? r0 + j->rows_per_chunk : j->n_rows;
    float *buf = j->buf + (size_t)ith * (size_t)j->ne0;
    for (int64_t r = r0; r < r1; r++) {
        dtype_to_f32(j->in_type, j->src + (size_t)r * j->in_rb, buf, j->ne0);
        bool finite = true;
        for (int64_t k = 0; k < j->ne0; k++) finite &= isfinite(buf[k]) != 0;
        if (!finite) {   /* every chunk runs to its end, so the smallest row is always found */
            if (j->bad_row[ith] < 0 || r < j->bad_row[ith]) j->bad_row[ith] = r;
            continue;
        }
        dtype_from_f32(j->out_type, buf, j->dst + (size_t)r * j->out_rb, j->ne0);
    }
}

int quant_model(const struct gguf *src, const struct quant_target *target, const struct quant_plan *p,
                struct threadpool *pool, struct gguf *dst, quant_tensor_fn on_tensor, void *user) {
    const char *in = src->path;
    int rc = 0;
    for (uint64_t i = 0; !rc && i < src->n_kv; i++)
        if ((rc = gguf_set_kv(dst, &src->kv[i])))
            LOG_ERR("%s: cannot copy metadata key '%.*s' (%s)", in, (int)src->kv[i].key.len, src->kv[i].key.ptr,
                    kvllm_strerror(rc));
    if (!rc) rc = gguf_set_u32(dst, "general.file_type", target->ftype);
    if (!rc) rc = gguf_set_u32(dst, "general.quantization_version", 2);
    if (rc) return rc;

    const int nth = threadpool_size(pool);
    int64_t max_ne0 = 1;
    for (uint64_t i = 0; i < src->n_tensors; i++)
        if (src->tensors[i].ne[0] > max_ne0) max_ne0 = src->tensors[i].ne[0];
    float *rowbuf = xmalloc((size_t)nth * (size_t)max_ne0 * sizeof *rowbuf);   /* (nth, max_ne0) */
    int64_t *bad = xcalloc((size_t)nth, sizeof *bad);
    if (!rowbuf || !bad) { free(rowbuf); free(bad); return KVLLM_ENOMEM; }
    for (uint64_t i = 0; !rc && i < src->n_tensors; i++) {
        const struct gguf_tensor *t = &src->tensors[i];
        char name[256];   /* the plan checked the length */
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = 0;
        const int64_t ne0 = t->ne[0];
        const uint32_t to = p->to[i];
        const void *data = t->data;
        uint64_t n_bytes = t->n_bytes;
        if (to != t->type) {
            uint64_t in_rb, out_rb;
            const int64_t n_rows = (int64_t)(t->n_elems / (uint64_t)ne0);
            if (!dtype_row_bytes(t->type, (uint64_t)ne0, &in_rb) || !dtype_row_bytes(to, (uint64_t)ne0, &out_rb) ||
                !ckd_mul_u64(&n_bytes, out_rb, (uint64_t)n_rows) || n_bytes > SIZE_MAX / 2) {
                LOG_ERR("%s: tensor '%s' does not fit in memory as %s", in, name, dtype_name(to));
                rc = KVLLM_ERANGE;
                break;
            }
            uint8_t *out = gguf_alloc(dst, n_bytes ? (size_t)n_bytes : 1);
            if (!out) { rc = KVLLM_ENOMEM; break; }
            int64_t rpc = CHUNK_ELEMS / ne0 > 0 ? CHUNK_ELEMS / ne0 : 1;
            struct conv_job j = { t->data, out, t->type, to, ne0, n_rows, rpc, (size_t)in_rb, (size_t)out_rb,
                                  rowbuf, bad };
            for (int k = 0; k < nth; k++) bad[k] = -1;
            threadpool_run_chunks(pool, (long)((n_rows + rpc - 1) / rpc), conv_chunk, &j);
            int64_t first_bad = -1;
            for (int k = 0; k < nth; k++)
                if (bad[k] >= 0 && (first_bad < 0 || bad[k] < first_bad)) first_bad = bad[k];
            if (first_bad >= 0) {
                LOG_ERR("%s: tensor '%s' row %lld holds a NaN or infinity", in, name, (long long)first_bad);
                rc = KVLLM_EFORMAT;
                break;
            }
            data = out;
        }
        if ((rc = gguf_add_tensor(dst, name, to, t->n_dims, t->ne, data))) {
            LOG_ERR("%s: cannot add tensor '%s' (%s)", dst->path, name, kvllm_strerror(rc));
            break;
        }
        if (on_tensor) on_tensor(i, name, t->type, to, t->n_bytes, n_bytes, user);
    }
    free(rowbuf);
    free(bad);
    return rc;
}
