/* kv_events.h — what the prefix cache holds, published to routers as vLLM
 * publishes it (`kvllm serve --kv-events`).
 *
 * Model of the world: the engine tells every block its prefix cache stores
 * or evicts (kvllm_engine_set_kv_events, on the engine thread); this module
 * names each block by a hash of its whole token prefix and queues the
 * event; after each engine step a publisher thread sends the step's
 * events as one batch on a ZMQ PUB socket (XPUB, to see subscriptions), framed as vLLM's
 * ZmqEventPublisher frames it: [topic,
 * sequence number (8 bytes, big-endian), msgpack payload].  The payload is
 * vLLM's KVEventBatch: [ts, [event...], data_parallel_rank 0], each event
 * BlockStored {block_hashes, parent_block_hash, token_ids, block_size,
 * lora_id, medium, lora_name}, BlockRemoved {block_hashes, medium} or
 * AllBlocksCleared {} — tagged maps {"type": NAME, ...} as vLLM encodes
 * them today and vllm-router reads them, or with `array` the positional
 * arrays [NAME, field...] of vLLM up to 0.11 (msgspec's array_like).  The
 * first batch of a process is [AllBlocksCleared]: a replica that restarted
 * tells its subscribers that what it held is gone.  Nothing goes out before
 * the first subscription arrives (the events wait queued), so a subscriber
 * that reconnects to a restarted replica cannot miss that first batch.
 *
 * The hash published is not the prefix cache's own: that one is keyed with
 * a per-process secret so that no one can forge a collision, and stays in
 * the engine.  Published is an unkeyed 64-bit chain (FNV-1a over the parent
 * block's published hash and the block's token ids), the same on every
 * replica and across restarts, as vLLM's with a fixed PYTHONHASHSEED; a
 * router keys on it only to chain parents and match removals.  A block
 * whose parent was never published (a second copy of a prefix computed
 * while the first was) is not told, nor are its descendants.
 *
 * Late subscribers: the last batches (10,000, or 64 MiB) are kept, and a
 * ROUTER socket at the replay endpoint answers [identity, "", start (8
 * bytes, big-endian)] with [identity, "", seq, payload] for every kept
 * batch from start on, then [identity, "", -1 (8 bytes), ""] — vLLM's
 * replay protocol.
 *
 * Memory: queued events grow buffers that the publisher thread swaps with
 * its own, so steady traffic reuses them; past 16 Mi queued tokens (a
 * publisher that cannot keep up; max_queued_tokens) events are dropped and
 * the next batch says AllBlocksCleared, so a subscriber underestimates what
 * is cached rather than believing in blocks that are gone.  The blocks told
 * before then count as never told from then on: their removals and
 * descendants are not told either. */
#ifndef KVLLM_SERVER_KV_EVENTS_H
#define KVLLM_SERVER_KV_EVENTS_H

#include "kvllm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kv_events_params {
    const char *endpoint;         /* PUB socket, bound: "tcp://HOST:PORT" (also ipc://, inproc://) */
    const char *replay_endpoint;  /* ROUTER socket, bound; NULL: no replay */
    const char *topic;            /* first frame of every message (NULL: "") */
    bool array_layout;            /* events as vLLM <= 0.11's positional arrays (default: tagged maps) */
    size_t max_queued_tokens;     /* tokens of events queued for the publisher before it counts as fallen
                                     behind (see above); 0: 16 Mi */
};

struct kv_events;

/* Bind the sockets (nothing is sent yet).  KVLLM_EIO (logged, naming the
 * endpoint and why) when one cannot be bound; KVLLM_EINVAL for an empty
 * endpoint; KVLLM_ENOMEM.  On error *out is NULL. */
int kv_events_new(const struct kv_events_params *p, struct kv_events **out);
/* Start publishing what `e` stores and evicts: sizes the per-block table
 * from the engine's stats, registers with kvllm_engine_set_kv_events and
 * starts the publisher thread, whose first batch is [AllBlocksCleared]
 * (sent when someone subscribes).
 * Call before the engine's thread starts stepping.  0 or KVLLM_ENOMEM. */
int kv_events_attach(struct kv_events *k, struct kvllm_engine *e);
/* The engine thread finished a step: its events (if any) go out now as
 * one batch.  NULL-safe. */
void kv_events_step_done(struct kv_events *k);
/* What the publisher told of the blocks the prefix cache holds now, to
 * check a subscriber's view against (GET /debug/kv/blocks). */
struct kv_events_held {
    uint64_t *hashes;  /* (n) the published hash of each block held and told, by ascending block id; malloc'd */
    int n;
    int n_untold;      /* held but never told: a block whose prefix was not (see above) */
    int n_stale;       /* told and not removed, yet no longer held: the publisher is out of step with the pool */
};
/* Fill *out from the engine's blocks (kvllm_engine_kv_blocks) and the
 * hashes this module gave them.  Engine thread, between steps: the events
 * of every step before are queued or sent, none of a later one.  0, or
 * KVLLM_ENOMEM (*out then empty).  The caller frees out->hashes. */
int kv_events_held(struct kv_events *k, struct kv_events_held *out);
/* Stop: call after the engine's thread stopped stepping (and before the
 * engine is freed).  What is queued is sent, the thread joined, the sockets
 * closed, the engine told to stop calling.  NULL-safe. */
void kv_events_free(struct kv_events *k);

#endif
