/* api.c — include/kvllm.h on top of the model, tokenizer and KV cache:
 * the one place where they meet. */
#include "engine/engine_internal.h"
#include "backend/backend_list.h"
#include "backend/cpu/cpu_features.h"
#include "core/core.h"
#include "load/llama2c.h"
#include "model/model.h"
#include "tensor/dtype.h"
#include "tok/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The job kvllm_tp_init joined: MPI's world is one per process, and so is this. */
static struct comm *g_comm;

int kvllm_tp_init(double timeout_s, int *rank, int *size) {
    *rank = 0;
    *size = 1;
    if (g_comm) { *rank = g_comm->rank; *size = g_comm->size; return 0; }
    int rc = comm_mpi_new(timeout_s, &g_comm);
    if (rc) return rc;
    if (g_comm) { *rank = g_comm->rank; *size = g_comm->size; }
    return 0;
}

bool kvllm_tp_mpi_built(void) { return comm_mpi_built(); }

void kvllm_tp_fail(const char *why) { comm_fail(g_comm, why); }

void kvllm_tp_stats(struct kvllm_tp_stats *out) {
    *out = (struct kvllm_tp_stats){ 0 };
    if (!g_comm) return;
    const struct comm_stats *s = &g_comm->stats;
    *out = (struct kvllm_tp_stats){
        .all_reduces = s->calls[COMM_ALL_REDUCE], .gathers = s->calls[COMM_GATHER], .broadcasts = s->calls[COMM_BCAST],
        .all_reduce_bytes = s->bytes_received[COMM_ALL_REDUCE], .gather_bytes = s->bytes_received[COMM_GATHER],
        .broadcast_bytes = s->bytes_received[COMM_BCAST],
        .all_reduce_s = s->seconds[COMM_ALL_REDUCE], .gather_s = s->seconds[COMM_GATHER],
        .broadcast_s = s->seconds[COMM_BCAST],
    };
}

void kvllm_tp_end(int code) {
    if (!g_comm) return;
    if (code || comm_failed(g_comm)) comm_abort(g_comm, code ? code : 1);
    if (g_comm->rank == 0) tp_exit(g_comm);
    comm_free(g_comm);
    g_comm = NULL;
}

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
    struct backend_params bp = { .cpu_kernels = p.cpu_kernels, .device = p.device };
    int rc = backend_kind_parse(p.backend, &bp.kind);
    if (!rc) rc = backend_act_parse(p.activations, &bp.act);
    if (!rc) rc = model_load_tp(path, &bp, p.n_threads, p.tensor_parallel ? g_comm : NULL, &km->m);
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
        .n_params = km->m->n_params, .weight_bytes = km->m->weight_bytes, .placed_bytes = km->m->placed_bytes,
        .weight_type = dtype_name(km->m->main_type),
    };
    engine_kv_groups(km->m, &km->desc.n_layer_swa, &km->desc.n_swa);
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

/* ---- metadata (appended for the CLI and server: info, /props) ---- */

const char *kvllm_model_meta_str(const struct kvllm_model *km, const char *key, size_t *len) {
    const struct gguf_kv *kv = km && km->m->file && key ? gguf_find(km->m->file, key) : NULL;
    if (!kv || kv->type != GGUF_T_STRING) return NULL;
    if (len) *len = (size_t)kv->v.str.len;
    return kv->v.str.ptr;
}

/* ---- build (appended for kvllm --version and the GPU-option note) ---- */

void kvllm_build_info(struct kvllm_build_info *out) {
    static const char *const sets[] = { "scalar", "scalar, avx2", "scalar, avx2, avx512", "scalar, avx2, avx512, amx" };
    int built = cpu_avx2_built() ? (cpu_q8_avx512_built() ? (cpu_q8_amx_built() ? 3 : 2) : 1) : 0;
    /* the CPU backend's own choice of the best set: the same rules as every engine */
    struct backend *be = NULL;
    const char *best = "scalar";
    if (backend_cpu_new(NULL, false, BACKEND_ACT_Q8, &be) == 0 && be->ops->name) best = be->ops->name;
    backend_free(be);
    int here = !strcmp(best, "amx") ? 3 : !strcmp(best, "avx512") ? 2 : !strcmp(best, "avx2") ? 1 : 0;
    out->cpu_kernels_built = sets[built];
    out->cpu_kernels_here = sets[here];
    out->cpu_kernels_default = here == 3 ? "amx" : here == 2 ? "avx512" : here == 1 ? "avx2" : "scalar";
    out->cuda_built = backend_cuda_built();
}
