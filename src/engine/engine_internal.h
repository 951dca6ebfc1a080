/* engine_internal.h — what the engine's files share: the model handle
 * (api.c), the engine and its requests (engine.c: creation, inbox and the
 * step), the output stage (output.c: sampling, detokenizing, stop strings,
 * events) and sessions (session.c). */
#ifndef KVLLM_ENGINE_INTERNAL_H
#define KVLLM_ENGINE_INTERNAL_H

#include "kvllm.h"
#include "kv/block_pool.h"
#include "kv/paged_kv.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "tok/tokenizer.h"

#include <pthread.h>

struct kvllm_model {
    struct model *m;           /* immutable once loaded: shared by every engine */
    struct tokenizer *tok;     /* NULL when the model carries no vocabulary */
    struct kvllm_model_desc desc;
    char path[512];
};

/* One sample of a request. */
struct seq_ctx {
    struct request *req;
    int index;
    struct kvllm_sampler *smp;
    struct detok detok;
    bool has_detok;
    char *held;             /* text withheld while it may begin a stop string */
    size_t n_held, cap_held;
    int n_generated;
    bool done;
};

/* A session's evaluation in progress (session.c). */
struct session_eval {
    int first;              /* first position whose logits are wanted (all_logits), else the last only */
    bool all;
    float *dst;             /* host: (n, n_vocab) or (n_vocab); NULL: none */
};

struct request {
    uint64_t id;
    kvllm_event_fn on_event;
    void *user;
    int n, n_done, max_tokens;
    bool ignore_eos, aborted, forked, queued, want_logits;
    bool failed;            /* a sequence ended with KVLLM_FINISH_ERROR */
    char **stop;
    int n_stop;
    size_t max_stop;        /* longest stop string */
    struct seq **seqs;      /* (n): seqs[0] runs the prompt, the others fork from it */
    struct seq_ctx *ctx;    /* (n) */
    int n_cached;
    struct session_eval *eval;  /* a session's sequence: logits are copied out, never sampled */
    struct request *next;   /* inbox or live list */
};

/* Step inputs: backend memory (d_*) sized for the largest step, and host
 * staging arrays (h_*) they are uploaded from. */
struct step_inputs {
    struct backend_buf buf;
    int32_t *d_tok, *d_pos, *d_slot, *d_seq, *d_rows;   /* (max_batch_tokens) */
    int32_t *d_table;                                    /* (max_seqs, max_blocks) */
    int32_t *h;                                          /* host slab: the five arrays above */
    int32_t *h_tok, *h_pos, *h_slot, *h_seq, *h_rows;
    int max_blocks;
};

struct kvllm_engine {
    struct kvllm_model *km;
    struct kvllm_engine_params p;
    int n_ctx;
    struct block_pool pool;
    struct paged_kv kv;
    struct sched sched;
    struct sched_batch sb;
    struct backend_ctx *ctx;                   /* this engine's execution context (stream) */
    struct forward_buf fb;
    struct step_inputs in;
    int n_logits_max;
    struct seq **logit_seqs;                   /* (n_logits_max) the sequence sampling from each row; NULL: a session's */
    float **logit_dst;                         /* (n_logits_max) host row each logits row is downloaded to */
    float *logits;                             /* host (n_logits_max, n_vocab): rows downloaded for sampling */
    char *text;                                /* event text scratch */
    const float *cur_logits;                   /* row being sampled, for events */
    size_t cap_text;

    pthread_mutex_t mu;                        /* guards the fields below, up to `live` */
    struct request *inbox, **inbox_tail;
    uint64_t *aborts;
    int n_aborts, cap_aborts, n_queued;
    uint64_t next_id;

    struct request *live;                      /* engine thread only */
    struct kvllm_engine_stats st;
};

/* engine.c */
/* kvllm_engine_new with room for n_logits_max rows of logits per step (sessions want more than max_seqs). */
int engine_new(struct kvllm_model *km, const struct kvllm_engine_params *params, int n_logits_max,
               struct kvllm_engine **out);
int engine_build_request(struct kvllm_engine *e, const struct kvllm_request *q, struct request **out);
void engine_request_free(struct request *r);
/* One step (drain the inbox, schedule, run, sample, reap); the tokens computed. */
int engine_step(struct kvllm_engine *e);
/* Test hook: the fail_after-th op from now fails with code (an injected
 * device or kernel error). */
void engine_test_fail_op(struct kvllm_engine *e, long fail_after, int code);

/* session.c: a session's private engine (tests reach its hooks through it) */
struct kvllm_engine *session_engine(struct kvllm_session *s);

/* output.c: the stage after the forward pass */
void output_finish_seq(struct kvllm_engine *e, struct seq *q, int32_t token, const char *text, size_t len,
                       enum kvllm_finish fin);
/* Sample (or, for a session, copy out) from the logits of a sequence whose
 * known tokens are all computed. */
void output_on_logits(struct kvllm_engine *e, struct seq *q, const float *logits);

#endif
