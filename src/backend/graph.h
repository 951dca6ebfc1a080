/* graph.h — a forward pass recorded once as a list of ops, then replayed.
 *
 * Model of the world (the role ggml's graph_compute plays): the ops a
 * model's forward issues depend on the shape of the step (its token and
 * logits counts, where its inputs lie) and on the model, never on the
 * values in backend memory.  So the forward can be issued once on a
 * recording context, which appends each op with its arguments (args
 * structs copied by value) to a graph instead of computing, and the graph
 * replayed for every later step of the same shape.  A backend with a
 * graph_compute op runs the list its own way (CUDA captures it into a CUDA
 * graph and launches that); the others replay it op by op (graph_replay),
 * which issues exactly the ops and arguments the forward would have.
 *
 * The one host value an op takes that may differ between two steps of the
 * same shape is paged attention's ctx_hi (the step's longest context): it
 * is not taken from the recording but passed at each replay.
 *
 * Only backend ops are recorded: a forward that does anything else on its
 * context (a host collective's upload, download or sync: tensor
 * parallelism) cannot be recorded, and the recording fails
 * (KVLLM_EUNSUPPORTED) rather than lose it.
 *
 * Memory: a graph's records are allocated by graph_init at a capacity the
 * caller chose (graph_count tells how many a forward takes); recording
 * never allocates, and a list longer than the capacity fails the recording
 * (KVLLM_ERANGE). */
#ifndef KVLLM_GRAPH_H
#define KVLLM_GRAPH_H

#include "backend/backend.h"

enum graph_op {
    GOP_MATMUL, GOP_GET_ROWS, GOP_GATHER_ROWS, GOP_RMSNORM, GOP_LAYERNORM, GOP_ROPE, GOP_ADD_BIAS, GOP_ADD,
    GOP_SWIGLU, GOP_GELU, GOP_GEGLU, GOP_SCALE, GOP_SOFTCAP, GOP_MOE_ROUTE, GOP_MOE, GOP_KV_STORE,
    GOP_PAGED_ATTN, GOP_ARGMAX, GOP_ADD_RMSNORM, GOP_ROPE_KV_STORE, GOP_MATMULS,
};

/* One recorded op: its arguments as the op took them (pointers are
 * backend memory or model-owned tensors, which outlive the graph). */
struct graph_rec {
    enum graph_op op;
    union {
        struct { float *y; const struct tensor *w; const float *x; int n; } matmul;
        struct { float *y; const struct tensor *w; const int32_t *ids; int n; } get_rows;
        struct { float *y; const float *x; const int32_t *ids; int n, dim; } gather_rows;
        struct { float *y; const float *x; const struct tensor *w, *b; int n, dim; float eps; } norm;
        struct { float *x; int n, n_head, head_dim; const int32_t *pos; struct rope_params p; } rope;
        struct { float *y; const struct tensor *b; int n, dim; } add_bias;
        struct { float *y; const float *x; long n; float s; } ew;   /* add, swiglu, geglu (x), gelu, scale, softcap */
        struct { int32_t *ids; float *weights; const float *logits; int n, n_expert, n_used; bool norm; } moe_route;
        struct moe_args moe;
        struct { struct kv_layer_view kv; const int32_t *slots; const float *k, *v; int n; } kv_store;
        struct paged_attn_args attn;
        struct { int32_t *ids; const float *x; int n, dim; } argmax;
        struct { float *y, *x; const float *h; const struct tensor *w; int n, dim; float eps; } add_rmsnorm;
        struct rope_kv_args rope_kv;
        struct matmuls_args matmuls;
    } u;
};

struct graph {
    struct graph_rec *recs;       /* (cap) */
    int n, cap;
    /* what a backend's graph_compute made of the list (a CUDA graph), freed
     * with exec_free when the graph is recorded anew or deinited; exec_ctx_hi
     * is the ctx_hi it was made with */
    void *exec;
    void (*exec_free)(void *exec);
    int exec_ctx_hi;
    bool no_exec;                 /* the backend could not make one: graph_compute replays instead */
};

/* A context whose ops append to a graph (graph_record_begin) instead of
 * computing.  Its ops table has an op exactly where the real context's
 * has one, so a forward that checks for an optional op sees the same
 * answer.  Caller-owned; nothing to free. */
struct graph_recorder {
    struct backend_ctx base;
    struct backend_ops ops;
    struct graph *g;
    int rc;                       /* the recording's first failure */
};

/* g with room for cap records; KVLLM_ENOMEM.  graph_deinit is NULL-safe
 * and takes a zeroed graph. */
int graph_init(struct graph *g, int cap);
void graph_deinit(struct graph *g);
/* Drop what a backend made of g (its exec). */
void graph_exec_drop(struct graph *g);

/* A recorder for the backend of real (which it never touches). */
void graph_recorder_init(struct graph_recorder *r, const struct backend_ctx *real);
/* Start recording into g (its records and exec dropped). */
void graph_record_begin(struct graph_recorder *r, struct graph *g);
/* 0, or why the recording is not usable: KVLLM_ERANGE (more records than
 * g's capacity), KVLLM_EUNSUPPORTED (the forward did something no record
 * holds), or the error a forward returned (rc_forward). */
int graph_record_end(struct graph_recorder *r, int rc_forward);
/* How many records recording ops onto r takes, whatever the capacity
 * (graph_record_begin on a graph of capacity 0, then count). */
int graph_recorded(const struct graph_recorder *r);

/* Issue g's records on c in order, through BE_OP (so a context's status
 * and test hooks work as for ops issued directly), paged attention with
 * ctx_hi.  The first error. */
int graph_replay(struct backend_ctx *c, const struct graph *g, int ctx_hi);
/* Run g on c: the backend's graph_compute when it has one, else
 * graph_replay.  The first error. */
int graph_compute(struct backend_ctx *c, struct graph *g, int ctx_hi);

#endif
