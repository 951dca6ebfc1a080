/* test_engine_oom.c — failures that must reach the caller, never vanish:
 * an abort that cannot be recorded returns KVLLM_ENOMEM (it was dropped);
 * withheld text or event text that cannot grow ends the sequence with
 * KVLLM_FINISH_ERROR (it was cut, or finished as a normal stop).  The
 * allocator is interposed (failing on demand), which AddressSanitizer
 * builds do not allow: there the test says so and checks nothing. */
#include "check.h"
#include "stories_util.h"
#include "engine/engine_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
int main(void) {
    printf("SKIP: allocation-failure injection interposes malloc, which this AddressSanitizer build owns\n");
    return check_report("test_engine_oom");
}
#else
static atomic_int g_fail;   /* fail every allocation while set */

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
void *malloc(size_t n) { return atomic_load(&g_fail) ? NULL : __libc_malloc(n); }
void *calloc(size_t a, size_t b) { return atomic_load(&g_fail) ? NULL : __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return atomic_load(&g_fail) ? NULL : __libc_realloc(p, n); }

struct out { int n_tokens, n_finish; enum kvllm_finish fin; size_t text; };

static void on_event(const struct kvllm_event *ev, void *user) {
    struct out *o = user;
    if (ev->token >= 0) o->n_tokens++;
    o->text += strlen(ev->text);
    if (ev->finish) { o->fin = ev->finish; o->n_finish++; }
}

static void add(struct kvllm_engine *e, struct out *o, const char *stop) {
    const char *stops[1] = { stop };
    struct kvllm_request q = { .prompt_text = "Once upon a time", .max_tokens = 40, .n = 1,
                               .sampling = kvllm_sampling_default_params(), .ignore_eos = true,
                               .stop = stops, .n_stop = stop ? 1 : 0, .on_event = on_event, .user = o };
    memset(o, 0, sizeof *o);
    CHECK(kvllm_engine_add(e, &q, NULL) == 0);
}

int main(void) {
    struct kvllm_model *m = load_stories(1);
    if (!m) return check_report("test_engine_oom");
    struct kvllm_engine *e = NULL;
    struct kvllm_engine_params ep = kvllm_engine_default_params();
    ep.n_ctx = 128;
    ep.kv_tokens = 512;
    CHECK(kvllm_engine_new(m, &ep, &e) == 0);
    if (!e) return check_report("test_engine_oom");
    fprintf(stderr, "(the out-of-memory errors below are injected)\n");

    /* 1. aborts: the recorded list is full and cannot grow */
    int rc = 0;
    for (uint64_t id = 1000; id < 1000 + (uint64_t)e->cap_aborts && !rc; id++) rc = kvllm_engine_abort(e, id);
    CHECK(rc == 0);
    atomic_store(&g_fail, 1);
    rc = kvllm_engine_abort(e, 5000);
    atomic_store(&g_fail, 0);
    CHECK_MSG(rc == KVLLM_ENOMEM, "an abort that could not be recorded returned %d", rc);
    CHECK(kvllm_engine_abort(e, 5000) == 0);   /* memory back: recorded */
    kvllm_engine_step(e);

    /* 2. withheld text: a stop string's prefix is held; its buffer cannot grow */
    struct out o;
    add(e, &o, "Once upon a time, there was a dragon who never appears in these stories");
    kvllm_engine_step(e);                      /* the prompt, the first token */
    struct request *r = e->live;
    CHECK(r && r->ctx[0].held);
    if (r) r->ctx[0].cap_held = r->ctx[0].n_held + 1;   /* the next piece needs more */
    atomic_store(&g_fail, 1);
    kvllm_engine_step(e);
    atomic_store(&g_fail, 0);
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    CHECK_MSG(o.fin == KVLLM_FINISH_ERROR && o.n_finish == 1, "held text that could not grow: finish %d", (int)o.fin);

    /* 3. event text: the event's buffer cannot grow for a long text */
    add(e, &o, NULL);
    kvllm_engine_step(e);
    e->cap_text = 1;                            /* any text needs more */
    atomic_store(&g_fail, 1);
    kvllm_engine_step(e);
    atomic_store(&g_fail, 0);
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    CHECK_MSG(o.fin == KVLLM_FINISH_ERROR && o.n_finish == 1, "event text that could not grow: finish %d", (int)o.fin);

    /* the engine serves on: a normal request completes */
    add(e, &o, NULL);
    while (!kvllm_engine_idle(e)) kvllm_engine_step(e);
    CHECK(o.fin == KVLLM_FINISH_LENGTH && o.n_tokens == 40 && o.text > 0);
    struct kvllm_engine_stats st;
    kvllm_engine_get_stats(e, &st);
    CHECK(st.blocks_held == 0);
    kvllm_engine_free(e);
    kvllm_model_free(m);
    return check_report("test_engine_oom");
}
#endif
