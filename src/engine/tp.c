/* tp.c — the engine's side of tensor parallelism (comm.h, docs/TP.md).
 *
 * Rank 0 runs the engines: requests, scheduling, block tables, sampling.
 * Every other rank mirrors them: for each engine rank 0 creates it creates
 * one of the same geometry (its own KV pool, of its own heads), and for
 * each of rank 0's steps it receives the step's inputs and runs the same
 * forward pass, which meets rank 0's in the collectives.  Rank 0 sends
 * three kinds of message (a header, then a payload of int32 words):
 *   TP_NEW   an engine was made: its plan (the pool's blocks are rank 0's,
 *            never re-derived from this rank's free memory)
 *   TP_STEP  the step's inputs (the step message, engine.c's step_msg)
 *   TP_FREE  an engine was freed;  TP_EXIT  the job ends cleanly.
 * A single process sends nothing: its step message is only run. */
#include "engine/engine_internal.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

enum tp_kind { TP_NEW = 1, TP_STEP, TP_FREE, TP_EXIT };

enum { TP_MAX_ENGINES = 64 };

/* Header: kind, engine id, payload words, then the kind's values. */
struct tp_hdr {
    int32_t kind, engine, n_words;
    int32_t v[9];
};

static int send_hdr(struct comm *cm, struct tp_hdr *h) { return comm_bcast(cm, h, sizeof *h, false); }

int tp_engine_announce(struct kvllm_engine *e) {
    struct comm *cm = e->km->m->comm;
    if (!cm) return 0;
    static atomic_int next_id = 1;
    e->tp_id = atomic_fetch_add(&next_id, 1);
    struct tp_hdr h = { .kind = TP_NEW, .engine = e->tp_id,
                        .v = { e->n_ctx, e->kv.type, e->p.block_size, e->p.max_seqs, e->p.max_batch_tokens,
                               e->n_logits_max, e->rollback, e->pool.n_blocks, e->p.kv_full } };
    return send_hdr(cm, &h);
}

void tp_engine_retire(struct kvllm_engine *e) {
    struct comm *cm = e->km->m->comm;
    if (!cm || !e->tp_id || comm_failed(cm)) return;
    struct tp_hdr h = { .kind = TP_FREE, .engine = e->tp_id };
    send_hdr(cm, &h);
}

int tp_step_send(struct kvllm_engine *e, const int32_t *msg, int n_words) {
    struct comm *cm = e->km->m->comm;
    if (!cm) return 0;
    struct tp_hdr h = { .kind = TP_STEP, .engine = e->tp_id, .n_words = n_words };
    int rc = send_hdr(cm, &h);
    return rc ? rc : comm_bcast(cm, (void *)msg, (size_t)n_words * sizeof *msg, false);
}

void tp_exit(struct comm *cm) {
    if (!cm || comm_failed(cm)) return;
    struct tp_hdr h = { .kind = TP_EXIT };
    send_hdr(cm, &h);
}

/* ---- ranks > 0 ---- */

struct mirror {
    int32_t id;
    struct kvllm_engine *e;
};

static int mirror_new(struct kvllm_model *km, const struct tp_hdr *h, struct mirror *tab, int *n) {
    if (*n == TP_MAX_ENGINES) {
        LOG_ERR("tensor-parallel worker: more than %d engines at once", TP_MAX_ENGINES);
        return KVLLM_ERANGE;
    }
    struct kvllm_engine_params p = kvllm_engine_default_params();
    p.n_ctx = h->v[0];
    p.kv_type = kv_type_name((enum kv_type)h->v[1]);
    p.block_size = h->v[2];
    p.max_seqs = h->v[3];
    p.max_batch_tokens = h->v[4];
    p.kv_full = h->v[8] != 0;
    struct kvllm_engine *e;
    int rc = engine_new_planned(km, &p, h->v[5], h->v[6], h->v[7], &e);
    if (rc) return rc;
    tab[*n].id = h->engine;
    tab[(*n)++].e = e;
    return 0;
}

static struct kvllm_engine *mirror_find(struct mirror *tab, int n, int32_t id) {
    for (int i = 0; i < n; i++)
        if (tab[i].id == id) return tab[i].e;
    return NULL;
}

static void mirror_free(struct mirror *tab, int *n, int32_t id) {
    for (int i = 0; i < *n; i++)
        if (tab[i].id == id) {
            kvllm_engine_free(tab[i].e);
            tab[i] = tab[--*n];
            return;
        }
}

int kvllm_tp_worker(struct kvllm_model *km) {
    struct comm *cm = km->m->comm;
    if (!cm || cm->rank == 0) {
        LOG_ERR("kvllm_tp_worker: this process is not a tensor-parallel rank > 0");
        return KVLLM_EINVAL;
    }
    struct mirror tab[TP_MAX_ENGINES];
    int n = 0, rc = 0;
    int32_t *msg = NULL;
    size_t cap = 0;
    for (;;) {
        struct tp_hdr h;
        if ((rc = comm_bcast(cm, &h, sizeof h, true))) break;
        if (h.kind == TP_EXIT) break;
        if (h.kind == TP_NEW) rc = mirror_new(km, &h, tab, &n);
        else if (h.kind == TP_FREE) mirror_free(tab, &n, h.engine);
        else if (h.kind == TP_STEP) {
            struct kvllm_engine *e = mirror_find(tab, n, h.engine);
            if ((size_t)h.n_words > cap) {
                int32_t *p = realloc(msg, (size_t)h.n_words * sizeof *p);
                if (!p) { rc = KVLLM_ENOMEM; break; }
                msg = p;
                cap = (size_t)h.n_words;
            }
            rc = comm_bcast(cm, msg, (size_t)h.n_words * sizeof *msg, false);
            if (!rc && !e) {
                LOG_ERR("tensor-parallel worker: a step of engine %d, which rank 0 never announced", h.engine);
                rc = KVLLM_EINVAL;
            }
            if (!rc) rc = engine_run_step(e, msg, h.n_words);
            if (!rc) rc = backend_sync(e->ctx);
        } else {
            LOG_ERR("tensor-parallel worker: unknown message kind %d from rank 0", h.kind);
            rc = KVLLM_EINVAL;
        }
        if (rc) break;
    }
    if (rc) comm_fail(cm, "this worker cannot follow rank 0's steps");
    while (n) mirror_free(tab, &n, tab[0].id);
    free(msg);
    return rc;
}
