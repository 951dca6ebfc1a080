/* fleet.c — what routers and gateways ask a worker besides completions:
 * where its KV events are published (vLLM's GET /kv_event_sources), its
 * load (SGLang's GET /get_load, which sglang-router and vllm-router's
 * power_of_two read as {"load"}), its configuration (GET /get_server_info,
 * /get_model_info) and a generation health probe (GET /health_generate);
 * with --kv-events also what the publisher told of the blocks the prefix
 * cache holds (GET /debug/kv/blocks), to check a subscriber's view against. */
#include "server/server_internal.h"

#include <json-c/json.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An endpoint as a subscriber can connect to it: a socket bound to every address (host "*", 0.0.0.0
 * or [::]) is named by the host the asker reached this server at (its Host header, port dropped),
 * which a router can connect to where "*" means nothing. */
static json_object *connectable(struct MHD_Connection *c, const char *ep) {
    static const char *const k_any[] = { "tcp://*:", "tcp://0.0.0.0:", "tcp://[::]:" };
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    for (size_t i = 0; host && *host && i < sizeof k_any / sizeof k_any[0]; i++) {
        size_t n = strlen(k_any[i]);
        if (strncmp(ep, k_any[i], n)) continue;
        const char *colon = host[0] == '[' ? strchr(host, ']') : NULL; /* [v6]:port */
        size_t hl = colon ? (size_t)(colon - host) + 1 : strcspn(host, ":");
        char buf[512];
        snprintf(buf, sizeof buf, "tcp://%.*s:%s", (int)(hl < 256 ? hl : 256), host, ep + n);
        return json_object_new_string(buf);
    }
    return json_object_new_string(ep);
}

/* [{"data_parallel_rank", "endpoint", "replay_endpoint", "topic"}], or [] without --kv-events. */
static int kv_event_sources(struct server *s, struct MHD_Connection *c) {
    json_object *a = json_object_new_array();
    if (s->kv_endpoint) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "data_parallel_rank", json_object_new_int(0));
        json_object_object_add(o, "endpoint", connectable(c, s->kv_endpoint));
        json_object_object_add(o, "replay_endpoint", s->kv_replay_endpoint ? connectable(c, s->kv_replay_endpoint) : NULL);
        json_object_object_add(o, "topic", json_object_new_string(s->kv_topic));
        json_object_array_add(a, o);
    }
    return send_json(c, 200, a);
}

static void add_int(json_object *o, const char *k, int64_t v) { json_object_object_add(o, k, json_object_new_int64(v)); }

/* The load a router balances on: requests running and waiting (SGLang's "load"), and their KV. */
static int get_load(struct server *s, struct MHD_Connection *c) {
    struct kvllm_engine_stats st = { 0 };
    server_stats(s, &st);
    json_object *o = json_object_new_object();
    add_int(o, "load", st.n_running + st.n_waiting);
    add_int(o, "num_reqs", st.n_running + st.n_waiting);
    add_int(o, "num_running_reqs", st.n_running);
    add_int(o, "num_waiting_reqs", st.n_waiting);
    add_int(o, "num_tokens", (int64_t)st.blocks_held * st.block_size);
    return send_json(c, 200, o);
}

static int server_info(struct server *s, struct MHD_Connection *c) {
    struct kvllm_engine_stats st = { 0 };
    bool ready = server_stats(s, &st);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "served_model_name", json_object_new_string(s->model_id));
    json_object_object_add(o, "model_path", json_object_new_string(s->model_id));
    json_object_object_add(o, "version", json_object_new_string(s->version));
    if (ready) {
        add_int(o, "block_size", st.block_size);     /* vLLM's name */
        add_int(o, "page_size", st.block_size);      /* SGLang's */
        add_int(o, "num_gpu_blocks", st.blocks_total);
        add_int(o, "max_total_num_tokens", (int64_t)st.blocks_total * st.block_size);
        add_int(o, "max_model_len", s->n_ctx);
        add_int(o, "context_length", s->n_ctx);
        add_int(o, "max_running_requests", s->max_seqs);
    }
    json_object_object_add(o, "enable_prefix_caching", json_object_new_boolean(1));
    json_object_object_add(o, "kv_events", json_object_new_boolean(s->kv_endpoint != NULL));
    return send_json(c, 200, o);
}

static int model_info(struct server *s, struct MHD_Connection *c) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "model_path", json_object_new_string(s->model_id));
    json_object_object_add(o, "tokenizer_path", json_object_new_string(s->model_id));
    json_object_object_add(o, "is_generation", json_object_new_boolean(1));
    return send_json(c, 200, o);
}

/* Taken on the engine thread: the pool and the publisher's names for its blocks change there. */
struct held_call {
    struct kv_events_held held;
    struct kvllm_engine_stats st;
    int rc;
};

static void held_on_engine(struct server *s, void *arg) {
    struct held_call *h = arg;
    h->rc = kv_events_held(s->kv_events, &h->held);
    kvllm_engine_get_stats(s->engine, &h->st);
}

/* {"block_size", "blocks_total", "blocks_held", "blocks_cached", "untold", "stale", "block_hashes": [...]}:
 * the published hash of every block the prefix cache holds (held by a request or cached), as the events
 * named it, between two engine steps.  A subscriber that applied every batch up to that step holds the same
 * set; "untold" counts blocks held but never told (their prefix was not), "stale" blocks told and not
 * removed that are no longer held (0 unless the publisher lost step with the pool). */
static int kv_blocks(struct server *s, struct MHD_Connection *c) {
    if (!s->kv_events)
        return http_error(c, 404, "unknown_endpoint", NULL, "GET /debug/kv/blocks is there with --kv-events only");
    struct held_call h = { 0 };
    if (server_engine_call(s, held_on_engine, &h))
        return http_error(c, 503, NULL, NULL, "the engine is not running (loading or stopping)");
    if (h.rc) return http_error(c, 500, NULL, NULL, "%s", kvllm_strerror(h.rc));
    json_object *o = json_object_new_object(), *a = json_object_new_array_ext(h.held.n);
    for (int i = 0; i < h.held.n; i++) json_object_array_add(a, json_object_new_uint64(h.held.hashes[i]));
    free(h.held.hashes);
    add_int(o, "block_size", h.st.block_size);
    add_int(o, "blocks_total", h.st.blocks_total);
    add_int(o, "blocks_held", h.st.blocks_held);
    add_int(o, "blocks_cached", h.st.blocks_cached);
    add_int(o, "untold", h.held.n_untold);
    add_int(o, "stale", h.held.n_stale);
    json_object_object_add(o, "block_hashes", a);
    return send_json(c, 200, o);
}

static const struct { const char *path; int (*fn)(struct server *, struct MHD_Connection *); } k_fleet[] = {
    { "/kv_event_sources", kv_event_sources },
    { "/get_load", get_load },
    { "/get_server_info", server_info },
    { "/server_info", server_info },
    { "/get_model_info", model_info },
    { "/health_generate", handle_health },
    { "/debug/kv/blocks", kv_blocks },
};

int handle_fleet(struct server *s, struct MHD_Connection *c, const char *url) {
    for (size_t i = 0; i < sizeof k_fleet / sizeof k_fleet[0]; i++)
        if (!strcmp(url, k_fleet[i].path)) return k_fleet[i].fn(s, c);
    return http_error(c, 404, NULL, NULL, "no route %s", url);
}
