/* kv_events.c — vLLM-format KV-cache events over ZMQ (see kv_events.h).
 *
 * Three parties: the engine thread queues events (kv_events_on_event:
 * a hash computed, a few words appended under the mutex) and, after each
 * step, writes an eventfd if the step queued any (kv_events_step_done); the
 * publisher thread owns both sockets, sleeps in zmq_poll on the replay
 * socket and that eventfd, and when woken swaps the queue with its own
 * buffers, encodes one batch — one engine step's events, as vLLM publishes
 * one scheduler step's — sends it and keeps it for replay; the main thread
 * only creates and frees.  A router learns of a block as soon as the step
 * that stored it ends, and an idle server does not wake. */
#include "server/kv_events.h"
#include "core/core.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define KVE_POLL_MS 1000                    /* idle: how often the publisher looks at its stop flag anyway */
#define KVE_MAX_QUEUED_TOKENS ((size_t)16 << 20) /* default: past this, drop and clear (a publisher that cannot keep up) */
#define KVE_RING_BATCHES 10000              /* replay: vLLM's buffer_steps */
#define KVE_RING_BYTES ((size_t)64 << 20)
#define KVE_HWM 100000                      /* vLLM's PUB high-water mark */

enum { EV_STORED, EV_REMOVED };

struct kve_event {
    int kind;
    uint64_t hash, parent;  /* parent: STORED with has_parent only */
    bool has_parent;
    size_t tok;             /* STORED: offset of its block_size tokens in the queue's tokens */
};

/* Events waiting for the publisher; two of them swap (the engine's, the publisher's). */
struct kve_queue {
    struct kve_event *ev;
    size_t n, cap;
    int32_t *tokens;
    size_t n_tok, cap_tok;
};

struct kve_kept { uint64_t seq; char *data; size_t len; };

struct kv_events {
    struct kv_events_params p;     /* strings owned */
    void *zctx, *pub, *replay;
    int wake_fd;                   /* eventfd: the queue became non-empty, or stop */
    struct kvllm_engine *engine;   /* set by attach: told to stop calling at free */
    int block_size, n_blocks;
    size_t max_queued_tokens;      /* past this, the queue is dropped and subscribers told AllBlocksCleared */
    uint64_t *ext;                 /* (n_blocks) published hash of each block, 0: not told (engine thread) */

    pthread_mutex_t mu;            /* guards q, overflow, stop */
    struct kve_queue q;
    bool overflow, stop;

    pthread_t thread;              /* publisher thread: everything below */
    bool started;
    struct kve_queue work;
    uint64_t seq;
    bool subscribed;               /* a subscription arrived: batches go out (until then they wait queued) */
    struct kve_kept *ring;         /* (KVE_RING_BATCHES) circular: oldest at ring_head */
    size_t ring_head, ring_n, ring_bytes;
};

/* ---- the published hash ---- */

/* FNV-1a 64 over the parent's hash (8 bytes, little-endian) and the block's
 * token ids (4 bytes each): a deterministic chain, so replicas agree. */
static uint64_t ext_hash(uint64_t parent, const int32_t *tokens, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) h = (h ^ ((parent >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < 4; i++) h = (h ^ (((uint32_t)tokens[t] >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    return h ? h : 1; /* 0 marks "not told" */
}

/* ---- the queue (engine thread appends, publisher swaps) ---- */

static bool queue_push(struct kve_queue *q, const struct kve_event *ev, const int32_t *tokens, int n_tok) {
    if (q->n == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 1024;
        struct kve_event *e = realloc(q->ev, cap * sizeof *e);
        if (!e) return false;
        q->ev = e;
        q->cap = cap;
    }
    if (q->n_tok + (size_t)n_tok > q->cap_tok) {
        size_t cap = q->cap_tok ? 2 * q->cap_tok : 16384;
        while (cap < q->n_tok + (size_t)n_tok) cap *= 2;
        int32_t *t = realloc(q->tokens, cap * sizeof *t);
        if (!t) return false;
        q->tokens = t;
        q->cap_tok = cap;
    }
    q->ev[q->n] = *ev;
    q->ev[q->n].tok = q->n_tok;
    q->n++;
    if (n_tok) memcpy(q->tokens + q->n_tok, tokens, (size_t)n_tok * sizeof *tokens);
    q->n_tok += (size_t)n_tok;
    return true;
}

static void queue_free(struct kve_queue *q) {
    free(q->ev);
    free(q->tokens);
    memset(q, 0, sizeof *q);
}

/* Wake the publisher (eventfd counts; a full counter means it is awake anyway). */
static void kick(struct kv_events *k) {
    uint64_t one = 1;
    ssize_t w = write(k->wake_fd, &one, sizeof one);
    (void)w;
}

/* The engine's callback: name the block, queue the event. */
static void kv_events_on_event(const struct kvllm_kv_event *ev, void *user) {
    struct kv_events *k = user;
    struct kve_event e = { 0 };
    if (ev->kind == KVLLM_KV_BLOCK_STORED) {
        e.kind = EV_STORED;
        e.has_parent = ev->parent >= 0;
        e.parent = e.has_parent ? k->ext[ev->parent] : 0;
        if (e.has_parent && !e.parent) { k->ext[ev->block] = 0; return; } /* its prefix was never told */
        e.hash = k->ext[ev->block] = ext_hash(e.parent, ev->tokens, k->block_size);
    } else {
        e.kind = EV_REMOVED;
        e.hash = k->ext[ev->block];
        k->ext[ev->block] = 0;
        if (!e.hash) return;
    }
    pthread_mutex_lock(&k->mu);
    bool was_over = k->overflow;
    if (!was_over) {
        bool full = k->q.n_tok + (size_t)k->block_size > k->max_queued_tokens;
        if (full || !queue_push(&k->q, &e, ev->tokens, e.kind == EV_STORED ? k->block_size : 0)) {
            k->overflow = true;  /* the next batch clears; what is queued is dropped */
            k->q.n = k->q.n_tok = 0;
        }
    }
    bool dropped = k->overflow;
    pthread_mutex_unlock(&k->mu);
    /* Subscribers are about to forget every block (AllBlocksCleared), and this event and those
     * dropped after it never reach them: no block counts as told any more, so none is named in a
     * later removal or as a parent (its descendants go untold, as any untold prefix's), and
     * kv_events_held agrees with what a subscriber holds. */
    if (dropped && !was_over) memset(k->ext, 0, (size_t)k->n_blocks * sizeof *k->ext);
    else if (dropped) k->ext[ev->block] = 0;
}

void kv_events_step_done(struct kv_events *k) {
    if (!k) return;
    pthread_mutex_lock(&k->mu);
    bool any = k->q.n > 0 || k->overflow;
    pthread_mutex_unlock(&k->mu);
    if (any) kick(k);
}

int kv_events_held(struct kv_events *k, struct kv_events_held *out) {
    *out = (struct kv_events_held){ 0 };
    int32_t *ids = malloc((size_t)k->n_blocks * sizeof *ids);
    bool *held = calloc((size_t)k->n_blocks, sizeof *held);
    out->hashes = malloc((size_t)k->n_blocks * sizeof *out->hashes);
    if (!ids || !held || !out->hashes) {
        free(ids);
        free(held);
        free(out->hashes);
        out->hashes = NULL;
        return KVLLM_ENOMEM;
    }
    int n = kvllm_engine_kv_blocks(k->engine, ids, k->n_blocks);
    for (int i = 0; i < n; i++) {
        held[ids[i]] = true;
        if (k->ext[ids[i]]) out->hashes[out->n++] = k->ext[ids[i]];
        else out->n_untold++;
    }
    for (int id = 0; id < k->n_blocks; id++) out->n_stale += k->ext[id] && !held[id];
    free(ids);
    free(held);
    return 0;
}

/* ---- encoding (msgpack, as msgspec encodes vLLM's structs) ---- */

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

/* A tagged struct of n_fields fields: {"type": tag, ...} or [tag, ...]. */
static void pack_event(const struct kv_events *k, msgpack_packer *pk, const char *tag, int n_fields) {
    if (k->p.array_layout) msgpack_pack_array(pk, (size_t)n_fields + 1);
    else { msgpack_pack_map(pk, (size_t)n_fields + 1); pack_str(pk, "type"); }
    pack_str(pk, tag);
}

/* A field's name (maps only: an array is positional). */
static void pack_field(const struct kv_events *k, msgpack_packer *pk, const char *name) {
    if (!k->p.array_layout) pack_str(pk, name);
}

/* Events [i, j) of q that BlockStored can carry as one: each the child of the one before. */
static size_t stored_run(const struct kve_queue *q, size_t i) {
    size_t j = i + 1;
    while (j < q->n && q->ev[j].kind == EV_STORED && q->ev[j].has_parent && q->ev[j].parent == q->ev[j - 1].hash) j++;
    return j;
}

static void pack_stored(const struct kv_events *k, msgpack_packer *pk, const struct kve_queue *q, size_t i, size_t j) {
    pack_event(k, pk, "BlockStored", 7);
    pack_field(k, pk, "block_hashes");
    msgpack_pack_array(pk, j - i);
    for (size_t x = i; x < j; x++) msgpack_pack_uint64(pk, q->ev[x].hash);
    pack_field(k, pk, "parent_block_hash");
    if (q->ev[i].has_parent) msgpack_pack_uint64(pk, q->ev[i].parent); else msgpack_pack_nil(pk);
    pack_field(k, pk, "token_ids");
    msgpack_pack_array(pk, (j - i) * (size_t)k->block_size);
    for (size_t x = i; x < j; x++)
        for (int t = 0; t < k->block_size; t++) msgpack_pack_uint32(pk, (uint32_t)q->tokens[q->ev[x].tok + (size_t)t]);
    pack_field(k, pk, "block_size");
    msgpack_pack_int(pk, k->block_size);
    pack_field(k, pk, "lora_id");
    msgpack_pack_nil(pk);
    pack_field(k, pk, "medium");
    pack_str(pk, "GPU"); /* vLLM's MEDIUM_GPU: the engine's own pool, whatever the device */
    pack_field(k, pk, "lora_name");
    msgpack_pack_nil(pk);
}

/* vLLM's BlockRemoved carries a list: consecutive removals go as one. */
static size_t removed_run(const struct kve_queue *q, size_t i) {
    size_t j = i + 1;
    while (j < q->n && q->ev[j].kind == EV_REMOVED) j++;
    return j;
}

static void pack_removed(const struct kv_events *k, msgpack_packer *pk, const struct kve_queue *q, size_t i, size_t j) {
    pack_event(k, pk, "BlockRemoved", 2);
    pack_field(k, pk, "block_hashes");
    msgpack_pack_array(pk, j - i);
    for (size_t x = i; x < j; x++) msgpack_pack_uint64(pk, q->ev[x].hash);
    pack_field(k, pk, "medium");
    pack_str(pk, "GPU");
}

/* One KVEventBatch: [ts, events, data_parallel_rank]. */
static void pack_batch(const struct kv_events *k, msgpack_sbuffer *sb, const struct kve_queue *q, bool cleared) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    size_t n_events = cleared;
    for (size_t i = 0; i < q->n; n_events++) i = q->ev[i].kind == EV_STORED ? stored_run(q, i) : removed_run(q, i);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_double(&pk, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
    msgpack_pack_array(&pk, n_events);
    if (cleared) pack_event(k, &pk, "AllBlocksCleared", 0);
    for (size_t i = 0, j; i < q->n; i = j) {
        bool st = q->ev[i].kind == EV_STORED;
        j = st ? stored_run(q, i) : removed_run(q, i);
        if (st) pack_stored(k, &pk, q, i, j); else pack_removed(k, &pk, q, i, j);
    }
    msgpack_pack_int(&pk, 0);
}

/* ---- sending and replay (publisher thread) ---- */

static void be64(uint64_t v, unsigned char out[8]) {
    for (int i = 7; i >= 0; i--) { out[i] = (unsigned char)(v & 0xff); v >>= 8; }
}

/* Keep a sent batch for replay (takes data), dropping the oldest past the limits. */
static void ring_keep(struct kv_events *k, uint64_t seq, char *data, size_t len) {
    while (k->ring_n && (k->ring_n == KVE_RING_BATCHES || k->ring_bytes + len > KVE_RING_BYTES)) {
        struct kve_kept *old = &k->ring[k->ring_head];
        k->ring_bytes -= old->len;
        free(old->data);
        k->ring_head = (k->ring_head + 1) % KVE_RING_BATCHES;
        k->ring_n--;
    }
    k->ring[(k->ring_head + k->ring_n) % KVE_RING_BATCHES] = (struct kve_kept){ seq, data, len };
    k->ring_n++;
    k->ring_bytes += len;
}

/* Send one batch of the work queue (and AllBlocksCleared first when asked). */
static void publish(struct kv_events *k, bool cleared) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    pack_batch(k, &sb, &k->work, cleared);
    unsigned char seq[8];
    be64(k->seq, seq);
    const char *topic = k->p.topic ? k->p.topic : "";
    /* PUB never blocks: past the high-water mark a slow subscriber misses messages (and can replay) */
    if (zmq_send(k->pub, topic, strlen(topic), ZMQ_SNDMORE) < 0 || zmq_send(k->pub, seq, 8, ZMQ_SNDMORE) < 0 ||
        zmq_send(k->pub, sb.data, sb.size, 0) < 0)
        LOG_WARN("kv events: batch %llu not sent: %s", (unsigned long long)k->seq, zmq_strerror(errno));
    if (k->replay && sb.data) {
        size_t len = sb.size;
        ring_keep(k, k->seq, msgpack_sbuffer_release(&sb), len);
    }
    msgpack_sbuffer_destroy(&sb);
    k->seq++;
}

/* Answer one replay request: [identity, "", start] -> the kept batches from start, then the end mark. */
static void serve_replay(struct kv_events *k) {
    zmq_msg_t part[3];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, k->replay, ZMQ_DONTWAIT) < 0) { zmq_msg_close(&m); break; }
        more = zmq_msg_more(&m);
        if (n < 3) part[n++] = m; else { zmq_msg_close(&m); n = 4; }
    }
    if (n != 3 || zmq_msg_size(&part[1]) != 0 || zmq_msg_size(&part[2]) != 8) {
        LOG_WARN("kv events: a replay request is not [identity, \"\", 8-byte start sequence]; ignored");
    } else {
        const unsigned char *b = zmq_msg_data(&part[2]);
        uint64_t start = 0;
        for (int i = 0; i < 8; i++) start = start << 8 | b[i];
        const void *id = zmq_msg_data(&part[0]);
        size_t id_len = zmq_msg_size(&part[0]);
        unsigned char seq[8];
        for (size_t i = 0; i < k->ring_n; i++) {
            const struct kve_kept *kept = &k->ring[(k->ring_head + i) % KVE_RING_BATCHES];
            if (kept->seq < start) continue;
            be64(kept->seq, seq);
            zmq_send(k->replay, id, id_len, ZMQ_SNDMORE);
            zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
            zmq_send(k->replay, seq, 8, ZMQ_SNDMORE);
            zmq_send(k->replay, kept->data, kept->len, 0);
        }
        memset(seq, 0xff, 8); /* -1: the end of the replay */
        zmq_send(k->replay, id, id_len, ZMQ_SNDMORE);
        zmq_send(k->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(k->replay, seq, 8, ZMQ_SNDMORE);
        zmq_send(k->replay, "", 0, 0);
    }
    for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&part[i]);
}

/* Read what subscribers sent the XPUB socket (a byte 1 or 0, then the topic).
 * The first subscription releases the batches held since start. */
static void read_subscriptions(struct kv_events *k) {
    unsigned char b[1];
    int n;
    while ((n = zmq_recv(k->pub, b, sizeof b, ZMQ_DONTWAIT)) >= 0)
        if (n >= 1 && b[0] == 1) k->subscribed = true;
}

/* Nothing is sent before someone subscribes: a replica that restarted says
 * AllBlocksCleared first, and a subscriber that reconnects only after ZMQ's
 * reconnect interval would miss it (and go on crediting the dead process's
 * blocks, as vllm-router does while the new sequence numbers are not lower
 * than the old).  Held, the first batch — AllBlocksCleared and whatever was
 * stored meanwhile — goes to the first subscriber; the queue's bound still
 * holds (past it, the held events are dropped and stay untold). */
static void *publisher_main(void *arg) {
    struct kv_events *k = arg;
    bool first = true;
    for (;;) {
        zmq_pollitem_t it[3] = { { NULL, k->wake_fd, ZMQ_POLLIN, 0 },
                                 { k->pub, 0, ZMQ_POLLIN, 0 },
                                 { k->replay, 0, ZMQ_POLLIN, 0 } };
        if (zmq_poll(it, k->replay ? 3 : 2, KVE_POLL_MS) > 0) {
            if (it[1].revents & ZMQ_POLLIN) read_subscriptions(k);
            if (it[2].revents & ZMQ_POLLIN) serve_replay(k);
            if (it[0].revents & ZMQ_POLLIN) {
                uint64_t n;
                ssize_t r = read(k->wake_fd, &n, sizeof n);
                (void)r;
            }
        }
        pthread_mutex_lock(&k->mu);
        bool stop = k->stop, cleared = false;
        if (k->subscribed) {
            struct kve_queue t = k->q;
            k->q = k->work;
            k->q.n = k->q.n_tok = 0;
            k->work = t;
            cleared = k->overflow;
            k->overflow = false;
        }
        pthread_mutex_unlock(&k->mu);
        if (cleared && !first)
            LOG_WARN("kv events: the publisher fell behind; events were dropped and subscribers told "
                     "AllBlocksCleared");
        if (k->subscribed && (k->work.n || cleared || first)) {
            publish(k, cleared || first); /* a process starts with nothing cached */
            first = false;
        }
        if (stop) break;
    }
    return NULL;
}

/* ---- life cycle ---- */

static int bind_socket(void *zctx, int type, const char *endpoint, const char *what, void **out) {
    void *s = zmq_socket(zctx, type);
    int hwm = KVE_HWM, linger = 0;
    if (!s) { LOG_ERR("%s %s: %s", what, endpoint, zmq_strerror(errno)); return KVLLM_EIO; }
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(s, endpoint) != 0) {
        LOG_ERR("%s %s: cannot bind: %s", what, endpoint, zmq_strerror(errno));
        zmq_close(s);
        return KVLLM_EIO;
    }
    *out = s;
    return 0;
}

int kv_events_new(const struct kv_events_params *p, struct kv_events **out) {
    *out = NULL;
    if (!p->endpoint || !*p->endpoint) { LOG_ERR("--kv-events: an endpoint is required (tcp://HOST:PORT)"); return KVLLM_EINVAL; }
    struct kv_events *k = calloc(1, sizeof *k);
    if (!k) return KVLLM_ENOMEM;
    pthread_mutex_init(&k->mu, NULL);
    k->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (k->wake_fd < 0) {
        LOG_ERR("--kv-events: eventfd: %s", strerror(errno));
        free(k);
        return KVLLM_EIO;
    }
    k->p.array_layout = p->array_layout;
    k->max_queued_tokens = p->max_queued_tokens ? p->max_queued_tokens : KVE_MAX_QUEUED_TOKENS;
    k->p.endpoint = strdup(p->endpoint);
    k->p.replay_endpoint = p->replay_endpoint && *p->replay_endpoint ? strdup(p->replay_endpoint) : NULL;
    k->p.topic = strdup(p->topic ? p->topic : "");
    k->ring = calloc(KVE_RING_BATCHES, sizeof *k->ring);
    k->zctx = zmq_ctx_new();
    int rc = !k->p.endpoint || !k->p.topic || !k->ring || (p->replay_endpoint && *p->replay_endpoint && !k->p.replay_endpoint)
             ? KVLLM_ENOMEM : !k->zctx ? KVLLM_EIO : 0;
    if (!rc) rc = bind_socket(k->zctx, ZMQ_XPUB, k->p.endpoint, "--kv-events", &k->pub);
    if (!rc && k->p.replay_endpoint) rc = bind_socket(k->zctx, ZMQ_ROUTER, k->p.replay_endpoint, "--kv-events-replay", &k->replay);
    if (rc) { kv_events_free(k); return rc; }
    *out = k;
    return 0;
}

int kv_events_attach(struct kv_events *k, struct kvllm_engine *e) {
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    k->block_size = st.block_size;
    k->n_blocks = st.blocks_total;
    k->ext = calloc((size_t)st.blocks_total, sizeof *k->ext);
    if (!k->ext) return KVLLM_ENOMEM;
    if (pthread_create(&k->thread, NULL, publisher_main, k)) return KVLLM_ENOMEM;
    k->started = true;
    k->engine = e;
    kvllm_engine_set_kv_events(e, kv_events_on_event, k);
    return 0;
}

void kv_events_free(struct kv_events *k) {
    if (!k) return;
    if (k->engine) kvllm_engine_set_kv_events(k->engine, NULL, NULL);
    if (k->started) {
        pthread_mutex_lock(&k->mu);
        k->stop = true;
        pthread_mutex_unlock(&k->mu);
        kick(k);
        pthread_join(k->thread, NULL);
    }
    if (k->pub) zmq_close(k->pub);
    if (k->replay) zmq_close(k->replay);
    if (k->zctx) zmq_ctx_term(k->zctx);
    for (size_t i = 0; k->ring && i < k->ring_n; i++) free(k->ring[(k->ring_head + i) % KVE_RING_BATCHES].data);
    free(k->ring);
    queue_free(&k->q);
    queue_free(&k->work);
    free(k->ext);
    free((char *)k->p.endpoint);
    free((char *)k->p.replay_endpoint);
    free((char *)k->p.topic);
    close(k->wake_fd);
    pthread_mutex_destroy(&k->mu);
    free(k);
}
