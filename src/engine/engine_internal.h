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
#include "backend/graph.h"
#include "sched/scheduler.h"
#include "sample/sampler.h"
#include "tok/tokenizer.h"
#include "grammar/grammar.h"

#include <pthread.h>

struct kvllm_model {
    struct model *m;           /* immutable once loaded: shared by every engine */
    struct tokenizer *tok;     /* NULL when the model carries no vocabulary */
    struct kvllm_model_desc desc;
    char path[512];
};

struct gpool;

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
    struct gmatcher *gm;    /* this sample's grammar state while it runs (constrain_attach; NULL: none yet) */
    uint32_t *allow;        /* (mask_words) the grammar's allow-mask, filled per token; NULL with gm */
    struct gpool *pool;     /* the engine's matcher pool, for a constrained sample (constrain.c) */
    struct request *shadow; /* KVLLM_SPEC_DRAFT: this sequence's copy in the draft engine (spec.c) */
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
    bool include_stop;            /* a matched stop string stays in the text (vLLM's include_stop_str_in_output) */
    bool failed;            /* a sequence ended with KVLLM_FINISH_ERROR */
    bool backend_greedy;    /* its tokens are picked by the backend's argmax (engine.c: greedy_on_backend) */
    bool backend_sample;    /* its tokens may be drawn by the backend's sample op (engine.c: sampled_on_backend) */
    char **stop;
    int n_stop;
    size_t max_stop;        /* longest stop string */
    struct seq **seqs;      /* (n): seqs[0] runs the prompt, the others fork from it */
    struct seq_ctx *ctx;    /* (n) */
    int n_cached;           /* prompt tokens the prefix cache served, noted at the first step that computed it */
    bool cached_noted;
    struct session_eval *eval;  /* a session's sequence: logits are copied out, never sampled */
    bool own_eval;              /* eval is freed with the request (a draft shadow's) */
    struct request *next;   /* inbox or live list */
    struct kvllm_grammar *grammar;  /* own reference (NULL: unconstrained); a constrained request never speculates */
    bool greedy;            /* temperature <= 0: a grammar's mask is filled only when the argmax is refused */
    int min_tokens;         /* the tokens of ban[] are masked until a sample has this many */
    int32_t *stop_ids;      /* (n_stop_ids) stop_token_ids: finish with STOP, not part of the text */
    int n_stop_ids;
    int32_t *ban;           /* (n_ban) masked before min_tokens: EOS (unless ignore_eos), the end tokens, stop_ids */
    int n_ban;
    uint32_t *min_mask;     /* (mask_words) every token but ban[]: the mask before min_tokens without a grammar */
    struct kvllm_engine *shadow_of; /* a draft shadow: the draft engine whose scheduler holds it (NULL: not queued) */
};

/* A recorded forward and the step shape it was recorded for (step.c). */
struct step_graph {
    struct graph g;
    int n_tokens, n_logits, stride, ctx_key;  /* ctx_key: the rounded ctx_hi a capturing backend baked in */
    uint64_t tick;                            /* last use (least recently used is recorded over) */
    bool valid;
};
#define STEP_GRAPHS 8

/* Step inputs (step.c): the packed layout (backend/step_layout.h) in host
 * staging memory the backend gave (stage) and in backend memory (buf),
 * both sized for the largest step; issue_batch's arrays (h_*) from which
 * the step message is built; the recorded forwards. */
struct step_inputs {
    struct backend_buf buf;
    void *stage;                                         /* (cap bytes) engine_host_alloc */
    size_t cap;
    int32_t *h;                                          /* host slab: the arrays below */
    int32_t *h_tok, *h_pos, *h_slot, *h_seq, *h_rows;   /* (max_batch_tokens) */
    int32_t *h_win_slot;                                 /* (max_batch_tokens); NULL without a window pool */
    int32_t *h_ids;                                      /* this step's picked ids: in e->logits, after its rows */
    struct sample_chain *d_smp, *h_smp;                  /* (n_logits_max) the rows the backend samples: each
                                                            one's truncations and draw (after the packed
                                                            inputs in buf, and in stage) */
    struct backend_buf smp_scratch;                      /* the sample op's scratch (empty without the op) */
    int max_blocks;
    bool has_win;
    bool use_graphs;                                     /* forwards recorded and replayed (not enforce_eager, not TP) */
    bool pad;                                            /* the backend captures (graph_compute): small steps padded */
    struct graph_recorder rec;
    struct step_graph graphs[STEP_GRAPHS];
    uint64_t tick, n_recorded, n_replayed;               /* n_*: forwards recorded and replayed (tests) */
};

struct kvllm_engine {
    struct kvllm_model *km;
    struct kvllm_engine_params p;
    int n_ctx;
    struct block_pool pool;                    /* every layer's blocks; with win_pool, the global layers' */
    struct paged_kv kv;
    /* a model with both sliding-window and global layers: the sliding layers' blocks and storage
       (engine_kv_groups; win_pool.n_blocks == 0 without) */
    struct block_pool win_pool;
    struct paged_kv kv_win;
    int window;
    struct kv_layer_view *kv_layers;           /* (n_layer) each layer's view, in its group's storage */
    struct sched sched;
    struct sched_batch sb;                     /* the step being run */
    /* asynchronous scheduling (kvllm_engine_params.async_scheduling): the next step, planned while sb
       ran (plan_next); next_planned: sb holds it, to be pruned and issued by the next engine_step */
    bool async;
    bool next_planned;
    struct sched_batch sb_next;
    void (*test_trace)(void *user, char what);  /* engine_test_trace (NULL: off) */
    void *test_trace_user;
    struct backend_ctx *ctx;                   /* this engine's execution context (stream) */
    struct forward_buf fb;
    struct step_inputs in;
    int n_logits_max;
    struct seq **logit_seqs;                   /* (n_logits_max) the sequence sampling from each row; NULL: a session's */
    float **logit_dst;                         /* (n_logits_max) host row each logits row is downloaded to */
    float *logits;                             /* host (n_logits_max, n_vocab) + n_logits_max int32 (engine_host_alloc):
                                                  rows downloaded for sampling, then the picked ids */
    char *text;                                /* event text scratch */
    const float *cur_logits;                   /* row being sampled, for events */
    uint64_t n_backend_picked;                 /* tokens the backend's argmax picked (tests) */
    uint64_t n_backend_sampled;                /* tokens the backend's sample op drew (tests) */
    size_t cap_text;
    int mask_words;                            /* (n_vocab + 31) / 32: one allow-mask */
    int32_t end_ids[8];                        /* EOS and the chat end-of-turn tokens of the vocabulary */
    int n_end;
    pthread_mutex_t gv_mu;                     /* builds gv once, at the first constrained add (any thread) */
    struct gvocab *gv;                         /* the vocabulary index for grammars (NULL until then) */
    struct gpool *gpool;                       /* matchers for running constrained samples (constrain.c) */
    kvllm_kv_event_fn kv_event_fn;             /* kvllm_engine_set_kv_events (NULL: off) */
    void *kv_event_user;

    pthread_mutex_t mu;                        /* guards the fields below, up to `live` */
    struct request *inbox, **inbox_tail;
    uint64_t *aborts;
    int n_aborts, cap_aborts, n_queued;
    uint64_t next_id;

    struct request *live;                      /* engine thread only */
    struct kvllm_engine_stats st;
    struct kvllm_engine *draft;                /* KVLLM_SPEC_DRAFT: the draft model's private engine (spec.c) */
    struct seq **spec_part;                    /* (max_seqs) sequences drafting in this step */
    int *spec_room;                            /* (max_seqs) drafts each may take */
    int rollback;                              /* engine_new's */
    int32_t *step_msg;                         /* (cap_msg) the step's inputs as one message (engine_run_step) */
    size_t cap_msg;
    int tp_id;                                 /* rank 0 of a tensor-parallel job: the id its mirrors know (tp.c) */
};

/* engine.c */
/* kvllm_engine_new with room for n_logits_max rows of logits per step (sessions want more than max_seqs);
 * rollback: positions a sequence may be rewound behind what it committed without a recompute from its
 * start (a draft engine's shadows: the drafts and one; see sched_set_window). */
int engine_new(struct kvllm_model *km, const struct kvllm_engine_params *params, int n_logits_max, int rollback,
               struct kvllm_engine **out);
/* engine_new with a KV pool of exactly n_blocks (> 0) blocks, whatever the memory: a tensor-parallel
 * rank's mirror of rank 0's engine (tp.c); 0: planned from the parameters and the memory. */
int engine_new_planned(struct kvllm_model *km, const struct kvllm_engine_params *params, int n_logits_max,
                       int rollback, int n_blocks, struct kvllm_engine **out);

/* How an engine keeps m's K/V: a model with both sliding-window and global layers keeps its *n_win
 * sliding layers' K/V for their window (*window positions, the longest) in a pool of their own; 0, 0
 * when every layer is of one kind (one pool, whole contexts). */
void engine_kv_groups(const struct model *m, int *n_win, int *window);
int engine_build_request(struct kvllm_engine *e, const struct kvllm_request *q, struct request **out);
void engine_request_free(struct request *r);
/* One step (drain the inbox, schedule, run, sample, reap); the tokens computed. */
int engine_step(struct kvllm_engine *e);
/* Test hook: the fail_after-th op from now fails with code (an injected
 * device or kernel error). */
void engine_test_fail_op(struct kvllm_engine *e, long fail_after, int code);
/* Test hook: fn(user, what) at each point of the step loop: 'S' a step
 * scheduled, 'I' its ops issued, 'W' the wait for them done (NULL: off). */
void engine_test_trace(struct kvllm_engine *e, void (*fn)(void *user, char what), void *user);

/* step.c: the step as one transaction with the backend */
/* Staging, the backend's input buffer, the step message and the recorded forwards, sized for the
 * largest step; after the KV pools, the context and the forward buffers.  KVLLM_ENOMEM or the
 * backend's allocation error (step_deinit frees what was made). */
int step_init(struct kvllm_engine *e);
void step_deinit(struct kvllm_engine *e);
/* Run a step message (issue_batch builds it on rank 0; other ranks receive it): block copies, the
 * inputs packed and uploaded in one copy, the forward issued (recorded and replayed, or eagerly).
 * The first error; results after backend_sync. */
int engine_run_step(struct kvllm_engine *e, const int32_t *msg, int n_words);
/* Host memory from the backend (pinned on a GPU), or aligned host memory; engine_host_free is NULL-safe. */
void *engine_host_alloc(struct backend *be, size_t bytes);
void engine_host_free(struct backend *be, void *p);

/* tp.c: tensor parallelism, rank 0's side (nothing is sent for a model of one rank) */
int tp_engine_announce(struct kvllm_engine *e);   /* after creation: the ranks > 0 make its mirror */
void tp_engine_retire(struct kvllm_engine *e);    /* at free */
int tp_step_send(struct kvllm_engine *e, const int32_t *msg, int n_words);
void tp_exit(struct comm *cm);                    /* the ranks > 0 leave kvllm_tp_worker */

/* spec.c: speculative decoding (see kvllm.h, enum kvllm_spec) */
/* At creation: the parameters checked and defaulted; for a draft model its private engine. */
int spec_init(struct kvllm_engine *e);
/* At the end of creation (the pool planned): a draft model's engine. */
int spec_start(struct kvllm_engine *e);
void spec_deinit(struct kvllm_engine *e);
/* When a request is built (never in a step): a draft model's shadow of each sample. */
int spec_request_init(struct kvllm_engine *e, struct request *r);
/* Before scheduling: append drafts to running sequences in decode (seq.n_spec). */
void spec_propose(struct kvllm_engine *e);
/* After the forward: verify q's drafts with its 1 + n_spec logits rows
 * (or, for a request whose greedy tokens the backend picks, the 1 + n_spec
 * picked ids; rows is then NULL) through the per-token output path; roll
 * back what was rejected.  Returns the rows consumed (1 + n_spec). */
int spec_verify(struct kvllm_engine *e, struct seq *q, float *const *rows, const int32_t *ids);

/* session.c: a session's private engine (tests reach its hooks through it) */
struct kvllm_engine *session_engine(struct kvllm_session *s);

/* constrain.c: grammars in the engine (the grammar module behind four calls) */
/* A reference to g for a request (NULL stays NULL). */
struct kvllm_grammar *constrain_ref(const struct kvllm_grammar *g);
void constrain_unref(struct kvllm_grammar *g);
/* At add (any thread): count c, a sample of r's grammar, in the engine's
 * matcher pool, and make the matchers the live samples may need (at most
 * max_seqs); builds the engine's vocabulary index at the first call (under
 * gv_mu).  KVLLM_EINVAL (logged) when the model has no vocabulary;
 * KVLLM_ENOMEM. */
int constrain_seq_new(struct kvllm_engine *e, const struct request *r, struct seq_ctx *c);
/* c's matcher, at its first token (engine thread): taken from the pool and
 * reset to its grammar; 0 at once when it has one or is unconstrained.
 * KVLLM_ERANGE when the grammar's start exceeds the matcher's capacity. */
int constrain_attach(struct seq_ctx *c);
/* c finished: its matcher goes back to the pool. */
void constrain_release(struct seq_ctx *c);
/* With the request: released and uncounted; the pool shrinks to what the
 * live samples may need, and is freed with the last of them. */
void constrain_seq_free(struct seq_ctx *c);
void constrain_engine_free(struct kvllm_engine *e);
/* Fill c->allow for the next token: the number of allowed tokens (0: none) or < 0. */
int constrain_fill(struct seq_ctx *c);
/* Advance c's matcher by tok; < 0 (state unchanged) when the grammar refuses it. */
int constrain_accept(struct seq_ctx *c, int32_t tok);
/* Nothing but an end token may follow. */
bool constrain_must_end(const struct seq_ctx *c);

/* output.c: the stage after the forward pass */
void output_finish_seq(struct kvllm_engine *e, struct seq *q, int32_t token, const char *text, size_t len,
                       enum kvllm_finish fin);
/* Sample (or, for a session, copy out) from the logits of a sequence whose
 * known tokens are all computed (forks a request's n > 1 samples first). */
void output_on_logits(struct kvllm_engine *e, struct seq *q, const float *logits);
/* The per-position path: sample q's next token from logits (its request's
 * logit bias, grammar mask and min_tokens applied), then accept it (append,
 * grammar advance, detokenize, stops, limits, events).  Speculative
 * verification calls it once per verified position; it stops being called
 * for q once q's seq_ctx is done.  Returns the token sampled, or < 0 when
 * none could be (the sequence then ended with FINISH_ERROR). */
int32_t output_sample_accept(struct kvllm_engine *e, struct seq *q, const float *logits);
/* Whether tok ends a sample of r without being part of its text: EOS
 * (unless ignore_eos), a stop_token_id, or with a grammar an end token. */
bool output_is_end(const struct kvllm_engine *e, const struct request *r, int32_t tok);
/* The same for a token the backend already picked (a greedy request whose
 * logits never left the backend); -1: no valid token. */
void output_on_token(struct kvllm_engine *e, struct seq *q, int32_t token);

#endif
