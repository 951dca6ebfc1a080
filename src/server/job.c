/* job.c — request lifecycle: engine events into a per-job queue, the HTTP
 * side waiting on it, and the reference count that decides who frees. */
#include "server/job.h"
#include "server/server_internal.h"
#include "core/core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

struct job *job_new(struct server *s, int n_prompts, int n, int n_vocab, int logprobs, double t_arrival, bool stream) {
    struct job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->subs = calloc((size_t)n_prompts, sizeof *j->subs);
    j->t_last = calloc((size_t)n_prompts * (size_t)n, sizeof *j->t_last);
    if (!j->subs || !j->t_last) { free(j->subs); free(j->t_last); free(j); return NULL; }
    pthread_mutex_init(&j->mu, NULL);
    j->srv = s;
    j->refs = 1;
    atomic_init(&j->cancelled, false);
    atomic_init(&j->gone, false);
    atomic_init(&j->shutdown, false);
    j->tail = &j->head;
    j->n_prompts = n_prompts;
    j->n = n;
    j->n_vocab = n_vocab;
    j->logprobs = logprobs;
    j->t_arrival = t_arrival;
    j->stream = stream;
    j->n_left = n_prompts * n;
    j->fd = -1;
    for (int k = 0; k < n_prompts; k++) j->subs[k] = (struct job_sub){ .job = j, .prompt = k };
    atomic_fetch_add(&s->n_jobs, 1);
    return j;
}

static void job_free(struct job *j) {
    for (struct job_event *e = j->head, *nx; e; e = nx) { nx = e->next; free(e); }
    pthread_mutex_destroy(&j->mu);
    free(j->subs);
    free(j->t_last);
    free(j);
}

void job_ref(struct job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void job_unref(struct job *j) {
    pthread_mutex_lock(&j->mu);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (last) job_free(j);
}

int job_submit(struct job *j, int k, struct kvllm_request *r, char *err, size_t err_cap) {
    struct job_sub *s = &j->subs[k];
    r->on_event = job_on_event;
    r->user = s;
    r->want_logits = j->logprobs >= 0;   /* logits leave the engine only for logprobs */
    /* the engine's reference is taken first: events may arrive before
     * kvllm_engine_add returns */
    job_ref(j);
    int rc = kvllm_engine_add_ex(j->srv->engine, r, &s->id, err, err_cap);
    if (rc) { job_unref(j); return rc; }
    s->added = true;
    server_kick(j->srv);
    return 0;
}

struct job_event *job_pop(struct job *j) {
    pthread_mutex_lock(&j->mu);
    struct job_event *e = j->head;
    if (e) {
        j->head = e->next;
        if (!j->head) j->tail = &j->head;
        e->next = NULL;
    }
    pthread_mutex_unlock(&j->mu);
    return e;
}

bool job_lost(struct job *j) {
    pthread_mutex_lock(&j->mu);
    bool lost = j->lost;
    pthread_mutex_unlock(&j->mu);
    return lost;
}

/* Resume the HTTP side if it waits (under mu). */
static void wake_locked(struct job *j) {
    if (!j->suspended) return;
    j->suspended = false;
    http_resume(j->conn);
}

bool job_suspend(struct job *j, struct MHD_Connection *c) {
    pthread_mutex_lock(&j->mu);
    /* checked under the lock the engine thread wakes us under, so a wake
     * cannot fall between the check and the suspension */
    bool wait = !j->head && !j->lost && !j->ping && !atomic_load(&j->gone) && j->n_left > 0;
    if (wait) {
        j->conn = c;
        j->suspended = true;
        http_suspend(c);
    }
    pthread_mutex_unlock(&j->mu);
    return wait;
}

bool job_take_ping(struct job *j) {
    pthread_mutex_lock(&j->mu);
    bool p = j->ping;
    j->ping = false;
    pthread_mutex_unlock(&j->mu);
    return p;
}

void job_cancel(struct job *j) {
    bool kicked = false;
    pthread_mutex_lock(&j->mu);
    for (int k = 0; k < j->n_prompts; k++) {
        struct job_sub *s = &j->subs[k];
        if (s->added && s->n_finished < j->n) { kvllm_engine_abort(j->srv->engine, s->id); kicked = true; }
    }
    pthread_mutex_unlock(&j->mu);
    if (kicked) server_kick(j->srv);
}

void job_client_gone(struct job *j) {
    atomic_store(&j->gone, true);
    job_cancel(j);
    pthread_mutex_lock(&j->mu);
    wake_locked(j);
    pthread_mutex_unlock(&j->mu);
}

void job_shutdown(struct job *j) {
    atomic_store(&j->shutdown, true);
    job_cancel(j);
}

void job_probe(struct job *j) {
    static const char k_continue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    pthread_mutex_lock(&j->mu);
    if (!j->probed && j->stream) {
        j->probed = j->ping = true;
        wake_locked(j);
    } else if (!j->probed && j->suspended) {
        /* MHD leaves a suspended connection alone, so these bytes cannot
         * interleave with its own; 1xx is not allowed to HTTP/1.0 clients,
         * which are then never probed */
        j->probed = true;
        if (j->http11 && j->fd >= 0) (void)!send(j->fd, k_continue, sizeof k_continue - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    /* a whole response being written right now needs no probe; an
     * unprobed job is looked at again on the watcher's next round */
    pthread_mutex_unlock(&j->mu);
}

/* Bytes a client may pipeline behind a request that waits, unread; past
 * them the watcher reads and drops them, JOB_DRAIN_ROUND at most a round.
 * Unread, they fill the receive window, and a close behind them never
 * arrives (the peer's FIN waits behind its unsent bytes): a client that
 * pipelined 280 KB and closed kept its generation running. */
#define JOB_PIPELINE_BYTES (64 * 1024)
#define JOB_DRAIN_ROUND (1 << 20)

void job_drain(struct job *j) {
    char buf[16384];
    bool gone = false;
    pthread_mutex_lock(&j->mu);
    int pending = 0;
    /* suspended: MHD does not read the socket, and the engine thread resumes it only under mu */
    if (j->suspended && j->fd >= 0 && (j->drained || (!ioctl(j->fd, FIONREAD, &pending) && pending >= JOB_PIPELINE_BYTES))) {
        for (size_t got = 0; got < JOB_DRAIN_ROUND;) {
            ssize_t n = recv(j->fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n <= 0) { gone = n == 0; break; }
            got += (size_t)n;
            j->drained = true;
        }
    }
    pthread_mutex_unlock(&j->mu);
    if (gone) job_client_gone(j);
}

bool job_drained(struct job *j) {
    pthread_mutex_lock(&j->mu);
    bool d = j->drained;
    pthread_mutex_unlock(&j->mu);
    return d;
}

void job_release(struct job *j) {
    http_unwatch(j->srv, j);
    atomic_store(&j->cancelled, true);
    job_cancel(j);
    pthread_mutex_lock(&j->mu);
    struct job_event *e = j->head;
    j->head = NULL;
    j->tail = &j->head;
    pthread_mutex_unlock(&j->mu);
    while (e) { struct job_event *nx = e->next; free(e); e = nx; }
    atomic_fetch_sub(&j->srv->n_jobs, 1);
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
        if (j->t_first == 0) j->t_first = now;
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
    }
    if (ev->finish != KVLLM_FINISH_NONE) {
        j->n_left--;
        if (++s->n_finished == j->n) drop = true;
    }
    if (j->stream || j->n_left == 0 || j->lost) wake_locked(j);
    pthread_mutex_unlock(&j->mu);
    free(e);   /* cancelled meanwhile */
    if (drop) job_unref(j);
}
