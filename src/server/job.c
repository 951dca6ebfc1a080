/* job.c — request lifecycle: engine events into a per-job queue, the HTTP
 * side waiting on it, and the reference count that decides who frees. */
#include "server/job.h"
#include "server/server_internal.h"
#include "core/core.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

struct job *job_new(struct server *s, int n_prompts, int n, int n_vocab, int logprobs, double t_arrival) {
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->subs = calloc((size_t)n_prompts, sizeof *j->subs);
    j->t_last = calloc((size_t)n_prompts * (size_t)n, sizeof *j->t_last);
    if (!j->subs || !j->t_last) { free(j->subs); free(j->t_last); free(j); return NULL; }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->srv = s;
    j->refs = 1;
    atomic_init(&j->cancelled, false);
    j->tail = &j->head;
    j->n_prompts = n_prompts;
    j->n = n;
    j->n_vocab = n_vocab;
    j->logprobs = logprobs;
    j->t_arrival = t_arrival;
    for (int k = 0; k < n_prompts; k++) j->subs[k] = (struct job_sub){ .job = j, .prompt = k };
    return j;
}

static void job_free(struct job *j) {
    for (struct job_event *e = j->head, *nx; e; e = nx) { nx = e->next; free(e); }
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j->subs);
    free(j->t_last);
    free(j);
}

static void job_unref(struct job *j) {
    pthread_mutex_lock(&j->mu);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_free(j);
}

int job_submit(struct job *j, int k, struct kvllm_request *r) {
    struct job_sub *s = &j->subs[k];
    r->on_event = job_on_event;
    r->user = s;
    /* the engine's reference is taken first: events may arrive before
     * kvllm_engine_add returns */
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    int rc = kvllm_engine_add(j->srv->engine, r, &s->id);
    if (rc) { job_unref(j); return rc; }
    s->added = true;
    server_kick(j->srv);
    return 0;
}

bool job_client_gone(int fd) {
    if (fd < 0) return false;
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return true;   /* orderly shutdown by the peer */
    return r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

/* How often a waiting HTTP thread looks at its socket: the bound on how long
 * a vanished client's sequences keep running. */
#define POLL_MS 50

int job_wait(struct job *j, int fd, struct job_event **out) {
    *out = NULL;
    for (;;) {
        /* look at the socket on a clock, not only when no event came: a
         * non-streaming request gets events every step and would otherwise
         * never notice that its client left */
        double now = time_now();
        if (now >= j->next_check) {
            j->next_check = now + POLL_MS * 1e-3;
            if (atomic_load(&j->srv->state) == SRV_STOPPING || job_client_gone(fd)) return JOB_GONE;
        }
        pthread_mutex_lock(&j->mu);
        if (!j->head && !j->lost) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += POLL_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        }
        struct job_event *e = j->head;
        if (e) {
            j->head = e->next;
            if (!j->head) j->tail = &j->head;
            e->next = NULL;
        }
        /* an event we failed to queue would leave us waiting forever */
        bool lost = j->lost && !e;
        pthread_mutex_unlock(&j->mu);
        if (e) { *out = e; return JOB_EVENT; }
        if (lost) return JOB_GONE;
    }
}

void job_release(struct job *j) {
    atomic_store(&j->cancelled, true);
    bool kicked = false;
    pthread_mutex_lock(&j->mu);
    for (int k = 0; k < j->n_prompts; k++) {
        struct job_sub *s = &j->subs[k];
        if (s->added && s->n_finished < j->n) { kvllm_engine_abort(j->srv->engine, s->id); kicked = true; }
    }
    struct job_event *e = j->head;
    j->head = NULL;
    j->tail = &j->head;
    pthread_mutex_unlock(&j->mu);
    while (e) { struct job_event *nx = e->next; free(e); e = nx; }
    if (kicked) server_kick(j->srv);
    job_unref(j);
}

/* log-softmax of the token and the n_top best alternatives over the raw
 * logits (OpenAI reports the model's distribution, before temperature and
 * truncation). */
static void fill_logprobs(struct job_event *e, const float *logits, int V, int n_top) {
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)logits[i] - (double)mx);
    const double lse = (double)mx + log(sum);
    e->logprob = (float)((double)logits[e->token] - lse);
    /* insertion into a short sorted list: V * n_top worst case, V typically */
    int n = 0;
    for (int i = 0; i < V && n_top > 0; i++) {
        float l = logits[i];
        if (!(l == l)) continue;  /* NaN */
        if (n == n_top && l <= e->top_lp[n - 1]) continue;
        int p = n < n_top ? n++ : n - 1;
        while (p > 0 && e->top_lp[p - 1] < l) {
            e->top_lp[p] = e->top_lp[p - 1];
            e->top_id[p] = e->top_id[p - 1];
            p--;
        }
        e->top_lp[p] = l;
        e->top_id[p] = i;
    }
    for (int i = 0; i < n; i++) e->top_lp[i] = (float)((double)e->top_lp[i] - lse);
    e->n_top = n;
}

void job_on_event(const struct kvllm_event *ev, void *user) {
    struct job_sub *s = user;
    struct job *j = s->job;
    const int c = s->prompt * j->n + ev->index;
    if (ev->token >= 0) {
        double now = time_now(), ttft = -1, itl = -1;
        if (!s->got_first) { s->got_first = true; ttft = now - j->t_arrival; }
        if (j->t_last[c] > 0) itl = now - j->t_last[c];
        j->t_last[c] = now;
        metrics_token(&j->srv->metrics, ttft, itl);
    }
    struct job_event *e = NULL;
    if (!atomic_load(&j->cancelled)) {
        size_t len = strlen(ev->text);
        e = malloc(sizeof *e + len + 1);
        if (e) {
            *e = (struct job_event){ .choice = c, .token = ev->token, .finish = ev->finish, .n_prompt = ev->n_prompt,
                                     .n_generated = ev->n_generated, .n_cached = ev->n_cached, .len = len };
            memcpy(e->text, ev->text, len + 1);
            if (j->logprobs >= 0 && ev->token >= 0 && ev->logits) fill_logprobs(e, ev->logits, j->n_vocab, j->logprobs);
        }
    }
    bool drop = false;
    pthread_mutex_lock(&j->mu);
    if (!atomic_load(&j->cancelled)) {
        if (e) { *j->tail = e; j->tail = &e->next; e = NULL; }
        else j->lost = true;
        pthread_cond_signal(&j->cv);
    }
    if (ev->finish != KVLLM_FINISH_NONE && ++s->n_finished == j->n) drop = true;
    pthread_mutex_unlock(&j->mu);
    free(e);   /* cancelled meanwhile */
    if (drop) job_unref(j);
}
