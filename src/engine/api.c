/* api.c — include/kvllm.h on top of the model, tokenizer and KV cache:
 * the one place where they meet. */
#include "kvllm.h"
#include "core/core.h"
#include "load/llama2c.h"
#include "model/model.h"
#include "tensor/dtype.h"
#include "tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvllm_model {
    struct model *m;
    struct tokenizer *tok;     /* NULL when the model carries no vocabulary */
    struct kvllm_model_desc desc;
    char path[512];
};

struct kvllm_model_params kvllm_model_default_params(void) {
    return (struct kvllm_model_params){ .tokenizer_path = NULL, .n_threads = 0 };
}

/* The tokenizer: from an explicit file (GGUF vocab or llama2.c
 * tokenizer.bin) or the model's own metadata; absent is not an error. */
static int load_tokenizer(struct kvllm_model *km, const char *tok_path) {
    if (!tok_path) {
        if (!gguf_find(km->m->file, "tokenizer.ggml.tokens")) return 0;
        return tokenizer_new(km->m->file, &km->tok);
    }
    struct gguf *g;
    int rc = vocab_file_open(tok_path, km->m->hp.n_vocab, &g);
    if (!rc) rc = tokenizer_new(g, &km->tok);
    gguf_free(g);
    return rc;
}

int kvllm_model_load(const char *path, const struct kvllm_model_params *params, struct kvllm_model **out) {
    *out = NULL;
    struct kvllm_model_params p = params ? *params : kvllm_model_default_params();
    struct kvllm_model *km = xcalloc(1, sizeof *km);
    if (!km) return KVLLM_ENOMEM;
    snprintf(km->path, sizeof km->path, "%s", path);
    int rc = model_load(path, getenv("KVLLM_CPU"), p.n_threads, &km->m);
    if (!rc) rc = load_tokenizer(km, p.tokenizer_path);
    if (!rc && km->tok && tokenizer_n_vocab(km->tok) > km->m->hp.n_vocab) {
        LOG_ERR("%s: the vocabulary has %d tokens but the model only %d embedding rows",
                p.tokenizer_path ? p.tokenizer_path : path, tokenizer_n_vocab(km->tok), km->m->hp.n_vocab);
        rc = KVLLM_EFORMAT;
    }
    if (rc) { kvllm_model_free(km); return rc; }
    const struct model_hparams *hp = &km->m->hp;
    km->desc = (struct kvllm_model_desc){
        .arch = km->m->arch, .n_vocab = hp->n_vocab, .n_embd = hp->n_embd, .n_layer = hp->n_layer,
        .n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim, .n_ff = hp->n_ff,
        .n_rot = hp->n_rot, .n_ctx_train = hp->n_ctx_train, .rope_theta = hp->rope_theta, .norm_eps = hp->norm_eps,
        .token_bos = km->tok ? tokenizer_bos(km->tok) : -1, .token_eos = km->tok ? tokenizer_eos(km->tok) : -1,
        .add_bos = km->tok ? tokenizer_add_bos(km->tok) : false,
        .n_params = km->m->n_params, .weight_bytes = km->m->weight_bytes,
        .weight_type = dtype_name(km->m->main_type),
    };
    *out = km;
    return 0;
}

void kvllm_model_free(struct kvllm_model *km) {
    if (!km) return;
    tokenizer_free(km->tok);
    model_free(km->m);
    free(km);
}

const struct kvllm_model_desc *kvllm_model_describe(const struct kvllm_model *km) { return &km->desc; }
const char *kvllm_model_backend(const struct kvllm_model *km) { return km->m->be->ops->name; }

/* ---- tokens ---- */

static int need_tok(const struct kvllm_model *km) {
    if (km->tok) return 0;
    LOG_ERR("%s: the model carries no vocabulary; pass a tokenizer (--tokenizer PATH)", km->path);
    return KVLLM_ENOTFOUND;
}

int kvllm_tokenize(const struct kvllm_model *km, const char *text, size_t len, bool add_bos, bool parse_special,
                   int32_t *ids, int n_max) {
    int rc = need_tok(km);
    return rc ? rc : tokenizer_encode(km->tok, text, len, add_bos, parse_special, ids, n_max);
}

int kvllm_token_to_bytes(const struct kvllm_model *km, int32_t id, char *buf, size_t cap) {
    int rc = need_tok(km);
    return rc ? rc : tokenizer_token_bytes(km->tok, -2, id, buf, cap);
}

struct kvllm_detok { struct detok d; };

int kvllm_detok_new(const struct kvllm_model *km, struct kvllm_detok **out) {
    *out = NULL;
    int rc = need_tok(km);
    if (rc) return rc;
    struct kvllm_detok *d = xcalloc(1, sizeof *d);
    if (!d) return KVLLM_ENOMEM;
    detok_init(&d->d, km->tok);
    *out = d;
    return 0;
}

void kvllm_detok_free(struct kvllm_detok *d) {
    if (!d) return;
    detok_deinit(&d->d);
    free(d);
}

const char *kvllm_detok_push(struct kvllm_detok *d, int32_t prev, int32_t id) { return detok_push(&d->d, prev, id); }
const char *kvllm_detok_flush(struct kvllm_detok *d) { return detok_flush(&d->d); }

/* ---- sessions ---- */

/* Activations are computed in chunks of at most this many tokens. */
#define SESSION_MAX_BATCH 512

struct kvllm_session {
    struct kvllm_model *km;
    struct kv_cache kv;
    struct forward_buf buf;
    int n_past;
    bool no_kv_cache;
    int32_t *history;      /* (n_ctx) tokens so far, replayed when there is no cache */
};

int kvllm_session_new(struct kvllm_model *km, const struct kvllm_session_params *p, struct kvllm_session **out) {
    *out = NULL;
    const struct model_hparams *hp = &km->m->hp;
    int n_ctx = p && p->n_ctx > 0 ? p->n_ctx : hp->n_ctx_train;
    if (n_ctx > (1 << 24)) {
        LOG_ERR("context of %d positions is beyond what kvllm supports (%d)", n_ctx, 1 << 24);
        return KVLLM_ERANGE;
    }
    int n_batch = n_ctx < SESSION_MAX_BATCH ? n_ctx : SESSION_MAX_BATCH;
    uint64_t kv_bytes, need, avail = mem_available_bytes();
    if (!kv_cache_bytes(hp->n_layer, n_ctx, hp->n_head_kv * hp->head_dim, &kv_bytes) ||
        !ckd_add_u64(&need, kv_bytes, forward_buf_bytes(hp, n_batch)) || (avail && need > avail)) {
        LOG_ERR("a KV cache of %d positions needs %.1f MiB (+%.1f MiB activations) but the machine has %.1f MiB "
                "available; lower -c or -n", n_ctx, (double)kv_bytes / 1048576.0,
                (double)forward_buf_bytes(hp, n_batch) / 1048576.0, (double)avail / 1048576.0);
        return KVLLM_ERANGE;
    }
    struct kvllm_session *s = xcalloc(1, sizeof *s);
    if (!s) return KVLLM_ENOMEM;
    s->km = km;
    s->no_kv_cache = p && p->no_kv_cache;
    int rc = kv_cache_init(&s->kv, hp->n_layer, n_ctx, hp->n_head_kv * hp->head_dim);
    if (!rc) rc = forward_buf_init(&s->buf, hp, n_batch);
    if (!rc && !(s->history = xmalloc((size_t)n_ctx * sizeof(int32_t)))) rc = KVLLM_ENOMEM;
    if (rc) { kvllm_session_free(s); return rc; }
    LOG_INFO("KV cache: %d positions x %d layers, f32, %.2f MiB%s", n_ctx, hp->n_layer,
             (double)kv_bytes / 1048576.0, s->no_kv_cache ? " (reused as scratch: --no-kv-cache)" : "");
    *out = s;
    return 0;
}

void kvllm_session_free(struct kvllm_session *s) {
    if (!s) return;
    kv_cache_deinit(&s->kv);
    forward_buf_deinit(&s->buf);
    free(s->history);
    free(s);
}

int kvllm_session_n_past(const struct kvllm_session *s) { return s->n_past; }

void kvllm_session_truncate(struct kvllm_session *s, int pos) {
    if (pos >= 0 && pos < s->n_past) s->n_past = pos;
}

/* Run tokens at positions pos0.. in chunks; logits rows as requested. */
static void forward_chunks(struct kvllm_session *s, const int32_t *tokens, int n, int pos0, bool all_logits,
                           float *logits) {
    const int V = s->km->m->hp.n_vocab;
    for (int i = 0; i < n; i += s->buf.n_max) {
        int c = n - i < s->buf.n_max ? n - i : s->buf.n_max;
        bool last = i + c == n;
        float *out = !logits ? NULL : all_logits ? logits + (size_t)i * V : last ? logits : NULL;
        model_forward(s->km->m, &s->kv, &s->buf, tokens + i, c, pos0 + i, all_logits, out);
    }
}

int kvllm_session_eval(struct kvllm_session *s, const int32_t *tokens, int n, bool all_logits, float *logits) {
    if (n <= 0) return KVLLM_EINVAL;
    if (n > s->kv.n_ctx - s->n_past) {
        LOG_ERR("%d more tokens do not fit: %d of %d context positions are used", n, s->n_past, s->kv.n_ctx);
        return KVLLM_ERANGE;
    }
    const int V = s->km->m->hp.n_vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V) {
            LOG_ERR("token id %d is out of range (vocabulary of %d)", tokens[i], V);
            return KVLLM_EINVAL;
        }
    memcpy(s->history + s->n_past, tokens, (size_t)n * sizeof *tokens);
    if (!s->no_kv_cache) {
        forward_chunks(s, tokens, n, s->n_past, all_logits, logits);
    } else {
        /* No cache kept between calls: recompute the whole prefix from
         * position 0 (its K/V only live for this call), then the new tokens. */
        if (s->n_past > 0) forward_chunks(s, s->history, s->n_past, 0, false, NULL);
        forward_chunks(s, tokens, n, s->n_past, all_logits, logits);
    }
    s->n_past += n;
    return 0;
}
