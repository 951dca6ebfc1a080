/* engine.c — the step loop: requests in, one batched forward pass per step,
 * tokens out through the output stage (output.c).  The engine thread owns
 * its execution context, KV storage and scheduler; kvllm_engine_add/abort
 * only touch the inbox under its mutex, so a server can call them from any
 * thread.  The model is shared and never written.
 *
 * Memory: the KV pool, activation buffers, step inputs and per-step arrays
 * are sized at creation; a request's sequences, samplers and detokenizers
 * are allocated by kvllm_engine_add (on the caller's thread), never inside
 * a step.
 *
 * Errors: a step whose ops fail (a device or kernel error, memory the
 * backend could not get) ends the requests it was computing with
 * KVLLM_FINISH_ERROR and releases their blocks; the engine keeps serving
 * everything else. */
#include "engine/engine_internal.h"
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct kvllm_engine_params kvllm_engine_default_params(void) {
    return (struct kvllm_engine_params){
        .n_ctx = 0, .kv_mem = 0, .kv_tokens = 0, .kv_type = "f16", .block_size = 16,
        .max_seqs = 32, .max_batch_tokens = 512, .max_queue = 1024, .prefix_caching = true,
    };
}

void engine_request_free(struct request *r) {
    if (!r) return;
    /* a draft shadow leaves the draft engine's scheduler, releasing its blocks there */
    if (r->shadow_of && r->seqs && r->seqs[0]->status != SEQ_FINISHED) sched_finish(&r->shadow_of->sched, r->seqs[0]);
    for (int i = 0; i < r->n; i++) {
        if (r->ctx) {
            engine_request_free(r->ctx[i].shadow);
            kvllm_sampler_free(r->ctx[i].smp);
            if (r->ctx[i].has_detok) detok_deinit(&r->ctx[i].detok);
            free(r->ctx[i].held);
            constrain_seq_free(&r->ctx[i]);
        }
        if (r->seqs) seq_free(r->seqs[i]);
    }
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->ban);
    free(r->min_mask);
    constrain_unref(r->grammar);
    if (r->own_eval) free(r->eval);
    free(r->seqs);
    free(r->ctx);
    free(r);
}

/* ---- creation: the memory plan ---- */

/* The longest weight row: n_ff (down), an expert's n_ff_exp (its down), n_embd (q, k, v, gate, up, the
 * router) or the query heads (wo). */
static int64_t max_weight_cols(const struct model_hparams *hp) {
    int64_t c = (int64_t)hp->n_head * hp->head_dim;
    if (hp->n_ff > c) c = hp->n_ff;
    if (hp->n_expert && hp->n_ff_exp > c) c = hp->n_ff_exp;
    return hp->n_embd > c ? hp->n_embd : c;
}

void engine_kv_groups(const struct model *m, int *n_win, int *window) {
    *n_win = *window = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const int w = m->layers[il].window;
        if (w <= 0) continue;
        (*n_win)++;
        if (w > *window) *window = w;
    }
    if (*n_win == m->hp.n_layer) *n_win = *window = 0;   /* one kind of layer: one pool, as ever */
}

/* Logits rows' worth of floats the picked ids take after the last row (n_logits_max int32). */
static int ids_rows(const struct kvllm_engine *e) {
    const int V = e->km->m->hp.n_vocab;
    return (e->n_logits_max + V - 1) / V;
}

/* The KV pools: the global layers' (every layer's, for a model of one
 * kind) holds whole contexts, sized by --kv-mem, --kv-tokens or max_seqs
 * full contexts; a hybrid model's sliding layers get a pool of their own,
 * sized for every sequence's window and a step's tokens (never more blocks
 * than the global pool has: a sequence never holds more sliding blocks
 * than global ones), and --kv-mem covers both. */
static int plan_pool(struct kvllm_engine *e, enum kv_type kt, int rollback, int forced_blocks) {
    const struct model *m = e->km->m;
    const struct model_hparams *hp = &m->hp;
    int n_win = 0;
    if (!e->p.kv_full) engine_kv_groups(m, &n_win, &e->window);
    const int n_glob = hp->n_layer - n_win, bs = e->p.block_size;
    const uint64_t bpt = paged_kv_bytes_per_token(kt, n_glob, hp->n_head_kv, hp->head_dim);
    const uint64_t win_bpt = n_win ? paged_kv_bytes_per_token(kt, n_win, hp->n_head_kv, hp->head_dim) : 0;
    const uint64_t win_per_seq = n_win ? (uint64_t)sched_win_blocks_per_seq(e->window, rollback, 0, bs) + 1 : 0;
    uint64_t win_blocks = (uint64_t)e->p.max_seqs * win_per_seq + (n_win ? (uint64_t)(e->p.max_batch_tokens + bs - 1) / bs : 0);
    const uint64_t win_bytes = win_blocks * (uint64_t)bs * win_bpt;
    struct backend *be = m->be;
    const uint64_t avail = be->ops->mem_available ? be->ops->mem_available(be) : mem_available_bytes();
    uint64_t tokens;
    if (forced_blocks > 0) tokens = (uint64_t)forced_blocks * (uint64_t)bs;   /* rank 0's plan, taken as it is */
    else if (e->p.kv_mem) tokens = e->p.kv_mem > win_bytes + bpt * (uint64_t)bs ? (e->p.kv_mem - win_bytes) / bpt
                                                                        : e->p.kv_mem / (bpt + win_bpt);
    else if (e->p.kv_tokens > 0) tokens = (uint64_t)e->p.kv_tokens;
    else {
        tokens = (uint64_t)e->p.max_seqs * (uint64_t)e->n_ctx;
        if (avail && tokens * bpt + win_bytes > avail / 2) tokens = avail / 2 > win_bytes ? (avail / 2 - win_bytes) / bpt : 0;
    }
    /* a byte budget rounds down; a token count rounds up to whole blocks */
    uint64_t n_blocks = e->p.kv_mem && forced_blocks <= 0 ? tokens / (uint64_t)bs : (tokens + (uint64_t)bs - 1) / (uint64_t)bs;
    if (n_blocks < 1 || n_blocks > (1u << 30)) {
        LOG_ERR("a KV pool of %llu tokens (%llu blocks of %d) is not usable", (unsigned long long)tokens,
                (unsigned long long)n_blocks, bs);
        return KVLLM_ERANGE;
    }
    if (win_blocks > n_blocks) win_blocks = n_blocks;
    const uint64_t glob_bytes = n_blocks * (uint64_t)bs * bpt, bytes = glob_bytes + win_blocks * (uint64_t)bs * win_bpt;
    if (avail && bytes > avail) {
        LOG_ERR("the KV pool needs %.1f MiB (%llu tokens x %llu bytes, %s) but the machine has %.1f MiB available; "
                "lower --kv-mem / --kv-tokens / -c", (double)bytes / 1048576.0, (unsigned long long)tokens,
                (unsigned long long)(bpt + win_bpt), kv_type_name(kt), (double)avail / 1048576.0);
        return KVLLM_ERANGE;
    }
    int rc = paged_kv_init(&e->kv, be, kt, n_glob, (int)n_blocks, bs, hp->n_head_kv, hp->head_dim);
    if (!rc) rc = block_pool_init(&e->pool, (int)n_blocks, bs);
    if (!rc && n_win) rc = paged_kv_init(&e->kv_win, be, kt, n_win, (int)win_blocks, bs, hp->n_head_kv, hp->head_dim);
    if (!rc && n_win) rc = block_pool_init(&e->win_pool, (int)win_blocks, bs);
    if (!rc && !(e->kv_layers = xmalloc((size_t)hp->n_layer * sizeof *e->kv_layers))) rc = KVLLM_ENOMEM;
    if (rc) return rc;
    for (int il = 0, ig = 0, iw = 0; il < hp->n_layer; il++)
        e->kv_layers[il] = n_win && m->layers[il].window > 0 ? e->kv_win.layers[iw++] : e->kv.layers[ig++];
    uint64_t act = forward_buf_bytes(hp, e->p.max_batch_tokens, e->n_logits_max + ids_rows(e));
    char tp[80] = "";
    if (m->tp_size > 1)
        snprintf(tp, sizeof tp, ", tensor-parallel rank %d of %d (its %d of the KV heads)", m->tp_rank, m->tp_size,
                 hp->n_head_kv);
    LOG_INFO("memory plan (%s%s): weights %.1f MiB (%s), activations %.1f MiB, KV pool %.1f MiB: %llu blocks x %d "
             "tokens = %llu tokens of %s (%llu bytes each), %.1f sequences of full context (%d)",
             be->ops->name, tp, (double)e->km->m->placed_bytes / 1048576.0,
             strncmp(be->ops->name, "strict", 6) == 0 ? "copied" : "mapped", (double)act / 1048576.0,
             (double)bytes / 1048576.0, (unsigned long long)n_blocks, bs,
             (unsigned long long)(n_blocks * bs), kv_type_name(kt), (unsigned long long)bpt,
             (double)(n_blocks * bs) / e->n_ctx, e->n_ctx);
    if (n_win) {
        /* a sequence at full context: the global layers hold n_ctx positions, the sliding ones their window */
        const uint64_t ctx_blocks = (uint64_t)(e->n_ctx + bs - 1) / (uint64_t)bs;
        const uint64_t decode_win = (uint64_t)sched_win_blocks_per_seq(e->window, rollback, 1, bs);
        const uint64_t seq_win = ctx_blocks < decode_win ? ctx_blocks : decode_win;
        const uint64_t per_seq = ctx_blocks * bs * bpt + seq_win * bs * win_bpt;
        const uint64_t full_seq = ctx_blocks * bs * (bpt + win_bpt);
        LOG_INFO("memory plan: %d of %d layers slide over %d positions and keep only their window: global layers "
                 "%.1f MiB (%llu bytes per token), sliding layers %.1f MiB (%llu blocks, %llu bytes per token); "
                 "KV per sequence at full context (%d): %.1f MiB, %.1fx less than a full cache (%.1f MiB)",
                 n_win, hp->n_layer, e->window, (double)glob_bytes / 1048576.0, (unsigned long long)bpt,
                 (double)(bytes - glob_bytes) / 1048576.0, (unsigned long long)win_blocks,
                 (unsigned long long)win_bpt, e->n_ctx, (double)per_seq / 1048576.0,
                 (double)full_seq / (double)per_seq, (double)full_seq / 1048576.0);
    }
    return 0;
}

/* EOS and the chat templates' end-of-turn tokens present in the vocabulary
 * as control or user-defined tokens: a grammar's string may end with any of
 * them, and min_tokens holds them back. */
static void find_end_tokens(struct kvllm_engine *e) {
    static const char *const names[] = { "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|eom_id|>",
                                         "<|endoftext|>", "<|return|>", "<|call|>" };   /* the last two: gpt-oss */
    const struct tokenizer *t = e->km->tok;
    if (!t) return;
    const int max_end = (int)(sizeof e->end_ids / sizeof *e->end_ids);
    const int eos = tokenizer_eos(t), nt = tokenizer_n_vocab(t);
    if (eos >= 0) e->end_ids[e->n_end++] = eos;
    for (int id = 0; id < nt && e->n_end < max_end; id++) {
        enum tok_type ty = tokenizer_type(t, id);
        if (id == eos || (ty != TOK_CONTROL && ty != TOK_USER_DEFINED)) continue;
        const char *p = tokenizer_piece(t, id);
        for (size_t k = 0; p && k < sizeof names / sizeof *names; k++)
            if (!strcmp(p, names[k])) { e->end_ids[e->n_end++] = id; break; }
    }
}

/* Whether steps are planned while the previous one runs (kvllm_engine_params.async_scheduling): asked
 * for, or left to the default on a backend that runs asynchronously; never where a step's plan depends
 * on the previous step's tokens (drafts are proposed from them), where blocks are dropped after every
 * step (no_kv_cache: the plan would count K/V about to go), or where other ranks replay rank 0's steps. */
static bool async_wanted(const struct kvllm_engine *e) {
    const struct model *m = e->km->m;
    const bool want = e->p.async_scheduling == KVLLM_ASYNC_ON ||
                      (e->p.async_scheduling == KVLLM_ASYNC_AUTO && strncmp(m->be->ops->name, "cuda", 4) == 0);
    const char *why_not = e->p.spec != KVLLM_SPEC_NONE ? "speculative decoding drafts from the last step's tokens"
                          : e->p.no_kv_cache ? "no_kv_cache drops the K/V the plan would count on"
                          : m->comm ? "tensor-parallel ranks replay rank 0's steps in order" : NULL;
    if (want && why_not && e->p.async_scheduling == KVLLM_ASYNC_ON)
        LOG_INFO("asynchronous scheduling is off: %s", why_not);
    return want && !why_not;
}

int engine_new(struct kvllm_model *km, const struct kvllm_engine_params *params, int n_logits_max, int rollback,
               struct kvllm_engine **out) {
    return engine_new_planned(km, params, n_logits_max, rollback, 0, out);
}

int engine_new_planned(struct kvllm_model *km, const struct kvllm_engine_params *params, int n_logits_max,
                       int rollback, int n_blocks, struct kvllm_engine **out) {
    *out = NULL;
    struct kvllm_engine_params p = params ? *params : kvllm_engine_default_params();
    struct kvllm_engine_params d = kvllm_engine_default_params();
    if (!p.kv_type) p.kv_type = d.kv_type;
    if (p.block_size <= 0) p.block_size = d.block_size;
    if (p.max_seqs <= 0) p.max_seqs = d.max_seqs;
    if (p.max_batch_tokens <= 0) p.max_batch_tokens = d.max_batch_tokens;
    if (p.max_queue <= 0) p.max_queue = d.max_queue;
    int kt = kv_type_parse(p.kv_type);
    if (kt < 0) {
        LOG_ERR("unknown KV type '%s' (f32, f16, bf16, int8, fp8)", p.kv_type);
        return KVLLM_EINVAL;
    }
    if (p.block_size > 4096 || p.max_seqs > 65536 || p.max_batch_tokens > (1 << 20) || p.max_queue > (1 << 24)) {
        LOG_ERR("block size %d, max seqs %d, max batch tokens %d or max queue %d out of range", p.block_size,
                p.max_seqs, p.max_batch_tokens, p.max_queue);
        return KVLLM_EINVAL;
    }
    const struct model_hparams *hp = &km->m->hp;
    const int n_ctx = p.n_ctx > 0 ? p.n_ctx : hp->n_ctx_train;
    int rc = model_check_ctx(km->m, n_ctx);  /* e.g. learned positions end at n_ctx_train */
    if (rc) return rc;
    struct kvllm_engine *e = xcalloc(1, sizeof *e);
    if (!e) return KVLLM_ENOMEM;
    e->km = km;
    e->p = p;
    e->n_ctx = n_ctx;
    e->n_logits_max = n_logits_max > p.max_seqs ? n_logits_max : p.max_seqs;
    e->rollback = rollback;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->gv_mu, NULL);
    e->mask_words = (hp->n_vocab + 31) / 32;
    find_end_tokens(e);
    e->inbox_tail = &e->inbox;
    e->next_id = 1;
    /* The waiting ring holds the accepted queue (max_queue) and the
     * preempted sequences, which are admitted ones, so at most max_seqs:
     * an accepted request always finds its place (never aborted for room). */
    struct sched_config sc = { .max_seqs = p.max_seqs, .max_batch_tokens = p.max_batch_tokens,
                               .max_waiting = p.max_queue + p.max_seqs,
                               .prefix_caching = p.prefix_caching && !p.no_kv_cache, .no_kv_cache = p.no_kv_cache };
    struct backend_ctx_params cp = { .n_threads = km->m->n_threads, .max_tokens = p.max_batch_tokens,
                                     .max_ctx = n_ctx, .n_head = hp->n_head, .head_dim = hp->head_dim,
                                     .max_cols = max_weight_cols(hp) };
    rc = spec_init(e);   /* before sizing: speculation wants 1 + k logits rows per sequence */
    if (rc) { kvllm_engine_free(e); return rc; }
    const size_t V = (size_t)hp->n_vocab, nl = (size_t)e->n_logits_max;
    rc = plan_pool(e, (enum kv_type)kt, rollback, n_blocks);
    if (!rc) rc = sched_init(&e->sched, &e->pool, &sc);
    if (!rc && e->win_pool.n_blocks) sched_set_window(&e->sched, &e->win_pool, e->window, rollback);
    if (!rc) rc = sched_batch_init(&e->sb, p.max_seqs);
    if (!rc) rc = sched_batch_init(&e->sb_next, p.max_seqs);
    if (!rc) rc = backend_ctx_new(km->m->be, &cp, &e->ctx);
    /* past the logits rows, room for the picked ids (one download takes both) */
    if (!rc) rc = forward_buf_init(&e->fb, km->m->be, hp, p.max_batch_tokens, e->n_logits_max + ids_rows(e));
    if (!rc) rc = step_init(e);
    if (!rc) {
        e->logit_seqs = xmalloc(nl * sizeof *e->logit_seqs);
        e->logit_dst = xmalloc(nl * sizeof *e->logit_dst);
        e->logits = engine_host_alloc(km->m->be, (nl * V + nl) * sizeof *e->logits);
        e->cap_text = 4096;
        e->text = xmalloc(e->cap_text);
        e->cap_aborts = 64;
        e->aborts = xmalloc((size_t)e->cap_aborts * sizeof *e->aborts);
        if (!e->logit_seqs || !e->logit_dst || !e->logits || !e->text || !e->aborts) rc = KVLLM_ENOMEM;
    }
    if (!rc) rc = comm_reserve(km->m->comm, (size_t)p.max_batch_tokens * (size_t)hp->n_embd > nl * V
                                                 ? (size_t)p.max_batch_tokens * (size_t)hp->n_embd : nl * V);
    if (!rc) rc = spec_start(e);
    if (!rc && km->m->comm && km->m->comm->rank == 0) rc = tp_engine_announce(e);
    if (rc) { kvllm_engine_free(e); return rc; }
    e->async = async_wanted(e);
    *out = e;
    return 0;
}

int kvllm_engine_new(struct kvllm_model *km, const struct kvllm_engine_params *params, struct kvllm_engine **out) {
    return engine_new(km, params, 0, 0, out);
}

void kvllm_engine_free(struct kvllm_engine *e) {
    if (!e) return;
    for (struct request *r = e->live, *n; r; r = n) { n = r->next; engine_request_free(r); }
    for (struct request *r = e->inbox, *n; r; r = n) { n = r->next; engine_request_free(r); }
    spec_deinit(e);   /* after the requests: their draft shadows leave the draft engine first */
    tp_engine_retire(e);
    struct backend *be = e->km->m->be;
    free(e->aborts);
    free(e->logit_seqs);
    free(e->logit_dst);
    engine_host_free(be, e->logits);
    free(e->text);
    step_deinit(e);
    forward_buf_deinit(&e->fb);
    backend_ctx_free(e->ctx);
    sched_batch_deinit(&e->sb);
    sched_batch_deinit(&e->sb_next);
    sched_deinit(&e->sched);
    block_pool_deinit(&e->pool);
    paged_kv_deinit(&e->kv);
    block_pool_deinit(&e->win_pool);
    paged_kv_deinit(&e->kv_win);
    free(e->kv_layers);
    constrain_engine_free(e);
    pthread_mutex_destroy(&e->gv_mu);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void engine_test_fail_op(struct kvllm_engine *e, long fail_after, int code) {
    e->ctx->fail_after = fail_after;
    e->ctx->fail_code = code;
}

void engine_test_trace(struct kvllm_engine *e, void (*fn)(void *user, char what), void *user) {
    e->test_trace = fn;
    e->test_trace_user = user;
}

static void trace(struct kvllm_engine *e, char what) {
    if (e->test_trace) e->test_trace(e->test_trace_user, what);
}

/* ---- submission (any thread) ---- */

/* The fields of item 5 and the grammar: every id in range, counts sane. */
static int check_constraints(struct kvllm_engine *e, const struct kvllm_request *q, int max_tokens) {
    const int V = e->km->m->hp.n_vocab;
    if (q->min_tokens < 0 || q->min_tokens > max_tokens) {
        LOG_ERR("invalid request: min_tokens %d must be in [0, max_tokens = %d]", q->min_tokens, max_tokens);
        return KVLLM_EINVAL;
    }
    if (q->n_stop_token_ids < 0 || (q->n_stop_token_ids && !q->stop_token_ids) || q->n_logit_bias < 0 ||
        (q->n_logit_bias && !q->logit_bias)) {
        LOG_ERR("invalid request: %d stop_token_ids, %d logit_bias entries (negative, or no array)",
                q->n_stop_token_ids, q->n_logit_bias);
        return KVLLM_EINVAL;
    }
    for (int i = 0; i < q->n_stop_token_ids; i++)
        if (q->stop_token_ids[i] < 0 || q->stop_token_ids[i] >= V) {
            LOG_ERR("stop_token_ids[%d] = %d is out of range (vocabulary of %d)", i, q->stop_token_ids[i], V);
            return KVLLM_EINVAL;
        }
    for (int i = 0; i < q->n_logit_bias; i++)
        if (q->logit_bias[i].token < 0 || q->logit_bias[i].token >= V || !isfinite(q->logit_bias[i].bias)) {
            LOG_ERR("logit_bias[%d]: token %d (vocabulary of %d), bias %g: the token must be in range and the "
                    "bias finite", i, q->logit_bias[i].token, V, (double)q->logit_bias[i].bias);
            return KVLLM_EINVAL;
        }
    if (q->grammar && !e->km->tok) {
        LOG_ERR("a grammar needs a vocabulary; the model has none");
        return KVLLM_EINVAL;
    }
    return 0;
}

/* r's stop ids, and the tokens held back before min_tokens (EOS unless
 * ignore_eos, the end tokens, the stop ids) with the mask that excludes
 * them. */
static int build_stops(struct kvllm_engine *e, const struct kvllm_request *q, struct request *r) {
    const int ns = q->n_stop_token_ids;
    if (ns && !(r->stop_ids = xmalloc((size_t)ns * sizeof *r->stop_ids))) return KVLLM_ENOMEM;
    if (ns) memcpy(r->stop_ids, q->stop_token_ids, (size_t)ns * sizeof *r->stop_ids);
    r->n_stop_ids = ns;
    r->min_tokens = q->min_tokens;
    if (!q->min_tokens) return 0;
    if (!(r->ban = xmalloc((size_t)(e->n_end + ns) * sizeof *r->ban))) return KVLLM_ENOMEM;
    const int eos = e->km->tok ? tokenizer_eos(e->km->tok) : -1;
    for (int i = 0; i < e->n_end; i++)
        if (e->end_ids[i] != eos || !q->ignore_eos || q->grammar) r->ban[r->n_ban++] = e->end_ids[i];
    for (int i = 0; i < ns; i++) r->ban[r->n_ban++] = q->stop_token_ids[i];
    if (q->grammar) return 0;   /* the grammar's mask is cleared of them per token */
    if (!(r->min_mask = xmalloc((size_t)e->mask_words * sizeof *r->min_mask))) return KVLLM_ENOMEM;
    memset(r->min_mask, 0xff, (size_t)e->mask_words * sizeof *r->min_mask);
    for (int i = 0; i < r->n_ban; i++) r->min_mask[r->ban[i] >> 5] &= ~(1u << (r->ban[i] & 31));
    return 0;
}

/* The sampling stage runs in the backend (the argmax op) for a request
 * whose next token is the plain argmax of its logits, so only the token id
 * leaves the backend.  Anything that changes the logits before the argmax,
 * or wants them, keeps the request on the host sampler: every such request
 * field must be listed here. */
static bool greedy_on_backend(const struct kvllm_request *q) {
    const struct kvllm_sampling_params *p = &q->sampling;
    return p->temperature <= 0 && p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f && !q->want_logits && q->n == 1 && !q->grammar && q->min_tokens == 0 &&
           q->n_logit_bias == 0;
}

/* A sampled request whose next token the chain alone decides (top-k,
 * top-p, min-p, temperature, the seeded draw): the backend's sample op can
 * draw it from logits that never leave the backend.  The same exclusions
 * as greedy_on_backend; n > 1 too (its samples fork from one row of
 * logits on the host). */
static bool sampled_on_backend(const struct kvllm_request *q) {
    const struct kvllm_sampling_params *p = &q->sampling;
    return p->temperature > 0 && p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f &&
           p->frequency_penalty == 0.0f && !q->want_logits && q->n == 1 && !q->grammar && q->min_tokens == 0 &&
           q->n_logit_bias == 0;
}

int engine_build_request(struct kvllm_engine *e, const struct kvllm_request *q, struct request **out) {
    const struct kvllm_model *km = e->km;
    const int V = km->m->hp.n_vocab;
    if (q->n_prompt < 1 || !q->prompt || q->n < 1 || q->n_stop < 0 || (q->n_stop && !q->stop)) {
        LOG_ERR("invalid request: %d prompt tokens, n = %d", q->n_prompt, q->n);
        return KVLLM_EINVAL;
    }
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= V) {
            LOG_ERR("prompt token %d at index %d is out of range (vocabulary of %d)", q->prompt[i], i, V);
            return KVLLM_EINVAL;
        }
    if (q->n_stop && !km->tok) {
        LOG_ERR("stop strings need a vocabulary; the model has none");
        return KVLLM_EINVAL;
    }
    if (q->n_prompt >= e->n_ctx || (q->max_tokens > 0 && (int64_t)q->n_prompt + q->max_tokens > e->n_ctx)) {
        LOG_ERR("prompt (%d tokens) + max_tokens %d exceed the context of %d positions", q->n_prompt,
                q->max_tokens > 0 ? q->max_tokens : 1, e->n_ctx);
        return KVLLM_ERANGE;
    }
    int max_len = q->max_tokens > 0 ? q->n_prompt + q->max_tokens : e->n_ctx;
    int rc = check_constraints(e, q, max_len - q->n_prompt);
    if (rc) return rc;
    rc = sched_check_fits(&e->sched, max_len, q->n);
    if (rc) return rc;
    struct request *r = xcalloc(1, sizeof *r);
    if (!r) return KVLLM_ENOMEM;
    r->on_event = q->on_event;
    r->user = q->user;
    r->n = q->n;
    r->max_tokens = max_len - q->n_prompt;
    r->ignore_eos = q->ignore_eos;
    r->want_logits = q->want_logits;
    r->include_stop = q->include_stop_str;
    r->grammar = constrain_ref(q->grammar);
    r->backend_greedy = greedy_on_backend(q);
    r->backend_sample = sampled_on_backend(q);
    r->greedy = !(q->sampling.temperature > 0.0f);
    r->seqs = xcalloc((size_t)q->n, sizeof *r->seqs);
    r->ctx = xcalloc((size_t)q->n, sizeof *r->ctx);
    r->stop = q->n_stop ? xcalloc((size_t)q->n_stop, sizeof *r->stop) : NULL;
    rc = r->seqs && r->ctx && (r->stop || !q->n_stop) ? 0 : KVLLM_ENOMEM;
    if (!rc) rc = build_stops(e, q, r);
    for (int i = 0; !rc && i < q->n_stop; i++) {
        r->stop[i] = strdup(q->stop[i] ? q->stop[i] : "");
        if (!r->stop[i]) rc = KVLLM_ENOMEM;
        else r->n_stop++;
        if (!rc && strlen(r->stop[i]) > r->max_stop) r->max_stop = strlen(r->stop[i]);
    }
    for (int i = 0; !rc && i < q->n; i++) {
        struct seq_ctx *c = &r->ctx[i];
        c->req = r;
        c->index = i;
        struct kvllm_sampling_params sp = q->sampling;
        sp.seed += (uint64_t)i;
        rc = kvllm_sampler_new(&sp, V, &c->smp);
        if (!rc && q->n_logit_bias) rc = kvllm_sampler_set_logit_bias(c->smp, q->logit_bias, q->n_logit_bias);
        if (!rc) rc = constrain_seq_new(e, r, c);
        if (!rc && !(r->seqs[i] = seq_new(0, q->prompt, q->n_prompt, max_len, e->p.block_size))) rc = KVLLM_ENOMEM;
        if (!rc && !q->no_text && km->tok) {
            detok_init(&c->detok, km->tok);
            c->detok.special = q->special_text;
            c->has_detok = true;
            /* the withheld text: a stop string's prefix plus a few pieces; sized
             * now so that a step does not allocate (it grows only for giants) */
            c->cap_held = 2 * r->max_stop + 1024;
            if (!(c->held = xmalloc(c->cap_held))) rc = KVLLM_ENOMEM;
        }
        if (!rc) {
            r->seqs[i]->owner = c;
            r->seqs[i]->n_reserved = i == 0 ? q->n : 1;
        }
    }
    if (!rc) rc = spec_request_init(e, r);
    if (rc) { engine_request_free(r); return rc; }
    *out = r;
    return 0;
}

/* A text prompt becomes ids (malloc'd into *ids). */
static int tokenize_prompt(struct kvllm_engine *e, const struct kvllm_request *q, struct kvllm_request *out,
                           int32_t **ids) {
    *out = *q;
    *ids = NULL;
    if (!q->prompt_text) return 0;
    size_t len = strlen(q->prompt_text);
    int n = kvllm_tokenize(e->km, q->prompt_text, len, true, false, NULL, 0);
    if (n < 0) return n;
    if (!(*ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof **ids))) return KVLLM_ENOMEM;
    int n2 = kvllm_tokenize(e->km, q->prompt_text, len, true, false, *ids, n);
    if (n2 != n) {
        LOG_ERR("tokenizing the prompt gave %d ids, then %d", n, n2);
        free(*ids);
        *ids = NULL;
        return n2 < 0 ? n2 : KVLLM_EINVAL;
    }
    out->prompt = *ids;
    out->n_prompt = n;
    return 0;
}

int kvllm_engine_add_ex(struct kvllm_engine *e, const struct kvllm_request *q, uint64_t *id, char *err, size_t err_cap) {
    struct log_capture cap;
    log_capture_begin(&cap, err, err_cap);
    int rc = kvllm_engine_add(e, q, id);
    log_capture_end(&cap);
    if (rc == KVLLM_EBUSY && err && err_cap && !err[0]) snprintf(err, err_cap, "%s", kvllm_strerror(rc));
    return rc;
}

int kvllm_engine_add(struct kvllm_engine *e, const struct kvllm_request *q0, uint64_t *id) {
    if (kvllm_engine_failed(e)) return KVLLM_ECOMM;   /* its job lost a rank: nothing can be computed */
    struct request *r;
    struct kvllm_request q1;
    int32_t *ids;
    int rc = tokenize_prompt(e, q0, &q1, &ids);
    if (!rc) rc = engine_build_request(e, &q1, &r);
    free(ids);
    if (rc) return rc;
    pthread_mutex_lock(&e->mu);
    if (e->n_queued >= e->p.max_queue) {
        pthread_mutex_unlock(&e->mu);
        engine_request_free(r);
        return KVLLM_EBUSY;
    }
    r->id = e->next_id++;
    for (int i = 0; i < r->n; i++) r->seqs[i]->id = r->id;
    r->queued = true;
    e->n_queued++;
    *e->inbox_tail = r;
    e->inbox_tail = &r->next;
    pthread_mutex_unlock(&e->mu);
    if (id) *id = r->id;
    return 0;
}

int kvllm_engine_abort(struct kvllm_engine *e, uint64_t id) {
    int rc = 0;
    pthread_mutex_lock(&e->mu);
    bool known = false;
    for (int i = 0; i < e->n_aborts && !known; i++) known = e->aborts[i] == id;
    if (!known && e->n_aborts == e->cap_aborts) {
        int cap = 2 * e->cap_aborts;
        uint64_t *a = realloc(e->aborts, (size_t)cap * sizeof *a);
        if (a) { e->aborts = a; e->cap_aborts = cap; }
    }
    if (!known && e->n_aborts < e->cap_aborts) e->aborts[e->n_aborts++] = id;
    else if (!known) {   /* never lose an abort silently: the caller learns it was not recorded */
        LOG_ERR("abort of request %llu could not be recorded: out of memory", (unsigned long long)id);
        rc = KVLLM_ENOMEM;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

/* ---- the step ---- */

static void drain_inbox(struct kvllm_engine *e) {
    pthread_mutex_lock(&e->mu);
    struct request *in = e->inbox;
    e->inbox = NULL;
    e->inbox_tail = &e->inbox;
    int n_ab = e->n_aborts;
    uint64_t ab[64];
    if (n_ab > 64) n_ab = 64;
    if (n_ab) {
        memcpy(ab, e->aborts, (size_t)n_ab * sizeof *ab);
        memmove(e->aborts, e->aborts + n_ab, (size_t)(e->n_aborts - n_ab) * sizeof *ab);
        e->n_aborts -= n_ab;
    }
    pthread_mutex_unlock(&e->mu);

    while (in) {
        struct request *r = in;
        in = in->next;
        r->next = e->live;
        e->live = r;
        /* room is guaranteed: the ring holds max_queue accepted requests
         * plus at most max_seqs preempted ones (engine_new) */
        int rc = sched_add(&e->sched, r->seqs[0]);
        KV_ASSERT(rc == 0);
    }
    for (int i = 0; i < n_ab; i++)
        for (struct request *r = e->live; r; r = r->next)
            if (r->id == ab[i]) r->aborted = true;
    for (struct request *r = e->live; r; r = r->next) {
        if (!r->aborted) continue;
        for (int k = 0; k < r->n; k++) output_finish_seq(e, r->seqs[k], -1, "", 0, KVLLM_FINISH_ABORT);
    }
}

/* Requests whose sequences are all done leave; queued ones count down. */
static void reap(struct kvllm_engine *e) {
    int admitted = 0;
    for (struct request **pr = &e->live; *pr;) {
        struct request *r = *pr;
        if (r->queued && (r->seqs[0]->status != SEQ_WAITING || r->n_done == r->n)) {
            r->queued = false;
            admitted++;
        }
        if (r->n_done == r->n) { *pr = r->next; engine_request_free(r); }
        else pr = &r->next;
    }
    if (admitted) {
        pthread_mutex_lock(&e->mu);
        e->n_queued -= admitted;
        pthread_mutex_unlock(&e->mu);
    }
}

/* Where a sequence's rows of logits go this step: the backend's argmax
 * (greedy_on_backend), its sample op (sampled_on_backend, when it has one
 * and the sequence is not verifying drafts, whose draws depend on the
 * verdicts), or the host (downloaded).  A session's rows are copied out,
 * never picked. */
enum row_route { ROUTE_ARGMAX, ROUTE_SAMPLE, ROUTE_HOST };

static enum row_route route_of(const struct kvllm_engine *e, const struct seq *q) {
    const struct request *r = ((const struct seq_ctx *)q->owner)->req;
    if (r->eval) return ROUTE_HOST;
    if (r->backend_greedy) return ROUTE_ARGMAX;
    return r->backend_sample && !q->n_spec && backend_supports(e->ctx->be, BACKEND_OP_SAMPLE, 0) ? ROUTE_SAMPLE
                                                                                                : ROUTE_HOST;
}

/* The rows of sequence q's chunk that need logits, appended to the logit
 * lists: a session's evaluation wants its new rows (or the last), a
 * request's sequence its last row once its known tokens are all computed.
 * Only the rows of `route`: the step lists the argmax rows, then the
 * sampled ones, then the host's. */
static int logit_rows_of(struct kvllm_engine *e, struct seq *q, int n_new, int row0, int nl, enum row_route route) {
    const struct request *r = ((struct seq_ctx *)q->owner)->req;
    const int V = e->km->m->hp.n_vocab;
    if (route_of(e, q) != route) return nl;
    for (int j = 0; j < n_new; j++) {
        const int t = q->n_computed + j;
        if (r->eval) {
            const struct session_eval *ev = r->eval;
            if (!ev->dst || !(ev->all ? t >= ev->first : t == q->n_tokens - 1)) continue;
            e->logit_seqs[nl] = NULL;
            e->logit_dst[nl] = ev->dst + (ev->all ? (size_t)(t - ev->first) * V : 0);
        } else {
            if (t < q->n_tokens - 1 - q->n_spec) continue;   /* the last row, and one per draft */
            e->logit_seqs[nl] = q;
            e->logit_dst[nl] = e->logits + (size_t)nl * V;
        }
        KV_ASSERT(nl < e->n_logits_max);
        e->in.h_rows[nl++] = row0 + j;
    }
    return nl;
}

/* The step's inputs as one message of int32 words, which rank 0 of a
 * tensor-parallel job broadcasts (tp.c) and every rank runs
 * (engine_run_step):
 *   k, n_logits, n_seqs, n_copies, n_win_copies, has_win;
 *   tok[k] pos[k] slot[k] seq[k] (win_slot[k]) rows[n_logits]
 *   copies[2 n_copies] win_copies[2 n_win_copies];
 *   per sequence: n_blocks, blocks[n_blocks] (win_blocks[n_blocks]).
 * Returns its words. */
static int pack_step(struct kvllm_engine *e, int k, int nl) {
    const struct sched_batch *b = &e->sb;
    const struct step_inputs *in = &e->in;
    const int has_win = in->h_win_slot != NULL;
    int32_t *w = e->step_msg;
    *w++ = k, *w++ = nl, *w++ = b->n_seqs, *w++ = b->n_copies, *w++ = b->n_win_copies, *w++ = has_win;
#define PUT(src, n) do { if ((n) > 0) memcpy(w, (src), (size_t)(n) * sizeof *w); w += (n); } while (0)
    PUT(in->h_tok, k); PUT(in->h_pos, k); PUT(in->h_slot, k); PUT(in->h_seq, k);
    if (has_win) PUT(in->h_win_slot, k);
    PUT(in->h_rows, nl);
    PUT(b->copies, 2 * b->n_copies);
    PUT(b->win_copies, 2 * b->n_win_copies);
    for (int i = 0; i < b->n_seqs; i++) {
        const struct seq *q = b->seqs[i];
        *w++ = q->n_blocks;
        PUT(q->blocks, q->n_blocks);
        /* entries before the window are -1: no window reads them */
        if (has_win) PUT(q->win_blocks, q->n_blocks);
    }
#undef PUT
    KV_ASSERT((size_t)(w - e->step_msg) <= e->cap_msg);
    return (int)(w - e->step_msg);
}

/* The sampling stage in the backend: argmax rows [0, ng), sampled rows
 * [ng, ns) (their chains and draws uploaded first); their ids are written
 * right after the step's last logits row (ids, n_logits rows in), where
 * issue_batch's one download takes them with the host's rows. */
static int sample_in_backend(struct kvllm_engine *e, int32_t *ids, int ng, int ns) {
    struct step_inputs *in = &e->in;
    struct backend_ctx *c = e->ctx;
    const int V = e->km->m->hp.n_vocab;
    int rc = 0;
    if (ng) rc = BE_OP(c, argmax, ids, e->fb.logits, ng, V);
    if (!rc && ns > ng) {
        for (int i = ng; i < ns; i++) {
            const struct seq_ctx *sc = e->logit_seqs[i]->owner;
            sampler_chain_next(sc->smp, &in->h_smp[i - ng]);   /* the draw the host sampler would take */
        }
        rc = c->ops->upload(c, in->d_smp, in->h_smp, (size_t)(ns - ng) * sizeof *in->h_smp);
        const struct sample_args a = { .n = ns - ng, .dim = V, .logits = e->fb.logits + (size_t)ng * V,
                                       .rows = in->d_smp, .ids = ids + ng, .scratch = in->smp_scratch.data };
        if (!rc) rc = BE_OP(c, sample, &a);
    }
    return rc;
}

/* Build the step's inputs, send them to the other ranks (tensor
 * parallelism) and issue its ops, then its one download: the logits rows
 * the host samples (n_sampled .. n_logits) and, right after them in backend
 * memory as in e->logits, the ids the backend picked (argmax rows 0 ..
 * n_greedy, sampled rows n_greedy .. n_sampled).  Returns the first error. */
static int issue_batch(struct kvllm_engine *e, int *n_logits, int *n_greedy, int *n_sampled) {
    const struct sched_batch *b = &e->sb;
    struct step_inputs *in = &e->in;
    struct backend_ctx *c = e->ctx;
    const struct backend_ops *ops = c->ops;
    const int bs = e->p.block_size, V = e->km->m->hp.n_vocab;
    int k = 0, nl = 0;
    for (int i = 0, row0 = 0; i < b->n_seqs; row0 += b->n_new[i], i++)
        nl = logit_rows_of(e, b->seqs[i], b->n_new[i], row0, nl, ROUTE_ARGMAX);
    const int ng = nl;
    for (int i = 0, row0 = 0; i < b->n_seqs; row0 += b->n_new[i], i++)
        nl = logit_rows_of(e, b->seqs[i], b->n_new[i], row0, nl, ROUTE_SAMPLE);
    const int ns = nl;
    for (int i = 0; i < b->n_seqs; i++) {
        struct seq *q = b->seqs[i];
        KV_ASSERT(q->n_blocks <= in->max_blocks);
        nl = logit_rows_of(e, q, b->n_new[i], k, nl, ROUTE_HOST);
        for (int j = 0; j < b->n_new[i]; j++, k++) {
            int t = q->n_computed + j;
            in->h_tok[k] = q->tokens[t];
            in->h_pos[k] = t;
            in->h_slot[k] = q->blocks[t / bs] * bs + t % bs;
            in->h_seq[k] = i;
            if (in->h_win_slot) {
                KV_ASSERT(q->win_blocks[t / bs] >= 0);
                in->h_win_slot[k] = q->win_blocks[t / bs] * bs + t % bs;
            }
        }
    }
    const int n_words = pack_step(e, k, nl);
    int rc = tp_step_send(e, e->step_msg, n_words);
    if (!rc) rc = engine_run_step(e, e->step_msg, n_words);
    /* the sampling stage: greedy and plainly sampled rows are picked in the
     * backend and only their token ids leave it; the other rows go to the
     * host sampler */
    const size_t vr = (size_t)V;
    in->h_ids = (int32_t *)(e->logits + (size_t)nl * vr);
    if (!rc) rc = sample_in_backend(e, (int32_t *)(e->fb.logits + (size_t)nl * vr), ng, ns);
    const size_t bytes = (size_t)(nl - ns) * vr * sizeof(float) + (size_t)ns * sizeof(int32_t);
    if (!rc) rc = ops->download(c, e->logits + (size_t)ns * vr, e->fb.logits + (size_t)ns * vr, bytes);
    *n_logits = nl;
    *n_greedy = ng;
    *n_sampled = ns;
    return rc;
}

/* A step that could not run: its sequences' requests end with an error. */
static void fail_batch(struct kvllm_engine *e, int rc) {
    const struct sched_batch *b = &e->sb;
    LOG_ERR("a step of %d tokens over %d sequences failed (%s); their requests end with an error", b->n_tokens,
            b->n_seqs, kvllm_strerror(rc));
    for (int i = 0; i < b->n_seqs; i++) {
        struct request *r = ((struct seq_ctx *)b->seqs[i]->owner)->req;
        for (int k = 0; k < r->n; k++) output_finish_seq(e, r->seqs[k], -1, "", 0, KVLLM_FINISH_ERROR);
    }
    e->st.failed_steps++;
}

/* Rows downloaded into e->logits whose destination is elsewhere (a session's) go there. */
static void place_rows(struct kvllm_engine *e, int n_picked, int nl) {
    const size_t V = (size_t)e->km->m->hp.n_vocab;
    for (int i = n_picked; i < nl; i++)
        if (e->logit_dst[i] != e->logits + (size_t)i * V)
            memcpy(e->logit_dst[i], e->logits + (size_t)i * V, V * sizeof(float));
}

/* Statistics sampled at every step that ran. */
static void note_step(struct kvllm_engine *e, const struct sched_batch *b) {
    const int bs = e->p.block_size;
    uint64_t alloc = 0, used = 0, ideal = 0;
    for (int i = 0; i < e->sched.n_running; i++) {
        const struct seq *q = e->sched.running[i];
        alloc += (uint64_t)q->n_blocks * bs;
        used += (uint64_t)q->n_computed;
        ideal += (uint64_t)sched_blocks_for(&e->sched, q->n_computed) * bs;
    }
    e->st.steps++;
    e->st.tokens_computed += (uint64_t)b->n_tokens;
    e->st.batch_seqs_sum += (uint64_t)b->n_seqs;
    e->st.kv_util_sum += (double)block_pool_n_held(&e->pool) / e->pool.n_blocks;
    e->st.kv_waste_sum += alloc ? (double)(alloc - used) / (double)alloc : 0.0;
    e->st.kv_waste_ideal_sum += ideal ? (double)(ideal - used) / (double)ideal : 0.0;
}

/* The step's tokens: a speculating sequence's rows are consecutive in its group: its last token's,
 * then one per draft; the greedy and sampled groups' tokens were picked by the backend (a sampled row
 * never speculates), the others are sampled here. */
static void take_tokens(struct kvllm_engine *e, int nl, int ng, int ns) {
    for (int i = 0; i < ns;) {
        struct seq *q = e->logit_seqs[i];
        if (q->n_spec) { i += spec_verify(e, q, NULL, e->in.h_ids + i); continue; }
        output_on_token(e, q, e->in.h_ids[i]);
        i++;
    }
    e->n_backend_picked += (uint64_t)ng;
    e->n_backend_sampled += (uint64_t)(ns - ng);
    for (int i = ns; i < nl;) {
        struct seq *q = e->logit_seqs[i];
        if (q && q->n_spec) { i += spec_verify(e, q, e->logit_dst + i, NULL); continue; }
        if (q) output_on_logits(e, q, e->logit_dst[i]);
        i++;
    }
}

/* A request's prefix-cache hit is known once its prompt was admitted. */
static void note_cached(const struct sched_batch *b) {
    for (int i = 0; i < b->n_seqs; i++) {
        struct seq *q = b->seqs[i];
        struct seq_ctx *c = q->owner;
        if (c->index == 0 && c->n_generated == 0 && q->n_preemptions == 0 && !c->req->cached_noted) {
            c->req->n_cached = q->n_computed;   /* not a later chunk's start: what the cache served */
            c->req->cached_noted = true;
        }
    }
}

/* Can the step after sb be planned before sb's tokens are known?  Not when one of its sequences forks
 * n > 1 samples off its first token (the forks join the running set only then, sharing the blocks
 * the plan would extend) or belongs to a session (its caller changes it between steps). */
static bool can_plan_next(const struct kvllm_engine *e) {
    if (!e->async) return false;
    for (int i = 0; i < e->sb.n_seqs; i++) {
        const struct request *r = ((const struct seq_ctx *)e->sb.seqs[i]->owner)->req;
        if (r->eval || (r->n > 1 && !r->forked)) return false;
    }
    return true;
}

/* Will q, just computed in the step in flight, get a token from it (a last row of logits, and not
 * the last token its limits allow)? */
static bool will_sample(const struct seq *q) {
    const struct seq_ctx *c = q->owner;
    return q->status == SEQ_RUNNING && q->n_computed == q->n_tokens && !c->done &&
           c->n_generated + 1 < c->req->max_tokens && q->n_tokens + 1 < q->max_len;
}

/* While the step in sb runs: take new requests and aborts, count sb's tokens computed, give each
 * sequence that will sample a placeholder for its token, and plan the next step into sb_next. */
static void plan_next(struct kvllm_engine *e) {
    drain_inbox(e);
    sched_advance(&e->sched, &e->sb);
    for (int i = 0; i < e->sb.n_seqs; i++)
        if (will_sample(e->sb.seqs[i])) sched_add_placeholder(e->sb.seqs[i]);
    sched_schedule(&e->sched, &e->sb_next);
    trace(e, 'S');
    e->st.steps_planned_ahead++;
    note_cached(&e->sb_next);
}

static void run_batch(struct kvllm_engine *e) {
    int nl = 0, ng = 0, ns = 0;
    int rc = issue_batch(e, &nl, &ng, &ns);
    trace(e, 'I');
    const bool ahead = !rc && can_plan_next(e);
    if (ahead) plan_next(e);
    int rs = backend_sync(e->ctx);     /* the one wait of the step */
    trace(e, 'W');
    for (int i = 0; ahead && i < e->sb.n_seqs; i++) sched_drop_placeholder(e->sb.seqs[i]);
    if (rc || rs) fail_batch(e, rc ? rc : rs);
    else {
        place_rows(e, ns, nl);
        if (ahead) sched_publish(&e->sched, &e->sb);
        else sched_commit(&e->sched, &e->sb);
        note_step(e, &e->sb);
        take_tokens(e, nl, ng, ns);
    }
    if (!ahead) return;
    /* the planned step becomes the next one; what finished at this one leaves it now, before reap
     * frees them */
    struct sched_batch t = e->sb;
    e->sb = e->sb_next;
    e->sb_next = t;
    sched_batch_prune(&e->sched, &e->sb);
    e->next_planned = true;
}

/* A tensor-parallel job that lost a rank computes nothing more: every request ends with an error. */
static void fail_all(struct kvllm_engine *e) {
    for (struct request *r = e->live; r; r = r->next)
        for (int k = 0; k < r->n; k++)
            if (!r->ctx[k].done) output_finish_seq(e, r->seqs[k], -1, "", 0, KVLLM_FINISH_ERROR);
}

/* One step.  Synchronous order: drain the inbox, schedule, issue, wait, commit, take the tokens,
 * reap.  Asynchronous (run_batch, plan_next): the step may have been planned while the previous one
 * ran; it is pruned of what finished since (an abort drained here too), issued, and the next is
 * planned before the wait. */
int engine_step(struct kvllm_engine *e) {
    drain_inbox(e);
    if (comm_failed(e->km->m->comm)) {
        fail_all(e);
        reap(e);
        return KVLLM_ECOMM;
    }
    const bool planned = e->next_planned;
    e->next_planned = false;
    if (planned) sched_batch_prune(&e->sched, &e->sb);
    if (!planned || !e->sb.n_tokens) {   /* nothing planned, or all of it finished: schedule now */
        if (e->p.spec != KVLLM_SPEC_NONE) spec_propose(e);
        sched_schedule(&e->sched, &e->sb);
        trace(e, 'S');
        note_cached(&e->sb);
    }
    int n = e->sb.n_tokens;
    if (n) run_batch(e);
    reap(e);
    return n;
}

int kvllm_engine_step(struct kvllm_engine *e) { return engine_step(e); }

bool kvllm_engine_failed(const struct kvllm_engine *e) { return comm_failed(e->km->m->comm); }

bool kvllm_engine_idle(struct kvllm_engine *e) {
    pthread_mutex_lock(&e->mu);
    bool pending = e->inbox != NULL || e->n_aborts > 0;
    pthread_mutex_unlock(&e->mu);
    return !pending && e->live == NULL;
}

/* The pool's listener, told in the public terms. */
static void engine_kv_event(const struct block_pool_event *ev, void *user) {
    struct kvllm_engine *e = user;
    const struct kvllm_kv_event out = {
        .kind = ev->kind == BLOCK_POOL_STORED ? KVLLM_KV_BLOCK_STORED : KVLLM_KV_BLOCK_REMOVED,
        .block = ev->id, .parent = ev->parent, .tokens = ev->tokens,
    };
    e->kv_event_fn(&out, e->kv_event_user);
}

void kvllm_engine_set_kv_events(struct kvllm_engine *e, kvllm_kv_event_fn fn, void *user) {
    e->kv_event_fn = fn;
    e->kv_event_user = user;
    block_pool_set_listener(&e->pool, fn ? engine_kv_event : NULL, fn ? e : NULL);
}

int kvllm_engine_kv_blocks(struct kvllm_engine *e, int32_t *ids, int cap) {
    int n = 0;
    for (int32_t id = 0; id < e->pool.n_blocks; id++) {
        if (e->pool.hash[id] == 0) continue; /* the pool's map holds exactly the published blocks */
        if (n < cap) ids[n] = id;
        n++;
    }
    return n;
}

void kvllm_engine_get_stats(struct kvllm_engine *e, struct kvllm_engine_stats *st) {
    *st = e->st;
    st->n_running = e->sched.n_running;
    st->n_waiting = e->sched.n_waiting;
    st->block_size = e->pool.block_size;
    st->blocks_total = e->pool.n_blocks;
    st->blocks_held = block_pool_n_held(&e->pool);
    st->blocks_cached = block_pool_n_cached(&e->pool);
    st->blocks_free = e->pool.n_free - st->blocks_cached;
    st->preemptions = e->sched.n_preemptions;
    st->prompt_tokens = e->sched.n_prompt_tokens;
    st->cached_tokens = e->sched.n_cached_tokens;
    const uint64_t blk = paged_kv_bytes_per_token(e->kv.type, e->kv.n_layer, e->kv.n_head_kv, e->kv.head_dim) *
                         (uint64_t)e->kv.block_size;
    st->kv_bytes = paged_kv_bytes(e->kv.type, e->kv.n_layer, e->kv.n_blocks, e->kv.block_size, e->kv.n_head_kv,
                                  e->kv.head_dim);
    st->kv_bytes_held = (uint64_t)st->blocks_held * blk;
    if (e->win_pool.n_blocks) {
        const struct paged_kv *w = &e->kv_win;
        st->window = e->window;
        st->win_blocks_total = e->win_pool.n_blocks;
        st->win_blocks_held = block_pool_n_held(&e->win_pool);
        st->win_blocks_cached = block_pool_n_cached(&e->win_pool);
        st->kv_bytes += paged_kv_bytes(w->type, w->n_layer, w->n_blocks, w->block_size, w->n_head_kv, w->head_dim);
        st->kv_bytes_held += (uint64_t)st->win_blocks_held * (uint64_t)w->block_size *
                             paged_kv_bytes_per_token(w->type, w->n_layer, w->n_head_kv, w->head_dim);
    }
}
