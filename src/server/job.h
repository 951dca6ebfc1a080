/* job.h — one HTTP completion request on its way through the engine.
 *
 * Model: a job owns one engine request per prompt, each with n samples;
 * choice c = prompt * n + sample.  The engine thread reports through
 * job_on_event, which copies every event (text, and log-probabilities when
 * asked) into the job's queue; the HTTP thread drains the queue.  A job is
 * reference-counted: one reference for the HTTP side and one per engine
 * request until that request's last sample has delivered its finishing event.
 * So the engine never calls into freed memory after a client left, and the
 * HTTP side never waits on a request the engine already forgot. */
#ifndef KVLLM_SERVER_JOB_H
#define KVLLM_SERVER_JOB_H

#include "kvllm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JOB_MAX_TOP 20      /* most alternatives per position (OpenAI's top_logprobs limit) */

struct server;

struct job_event {
    struct job_event *next;
    int choice;                      /* prompt * n + sample index */
    int32_t token;                   /* -1: an event that only finishes */
    enum kvllm_finish finish;
    int n_prompt, n_generated, n_cached;
    float logprob;                   /* of token, under the raw model distribution (when asked) */
    int n_top;                       /* alternatives below, best first */
    int32_t top_id[JOB_MAX_TOP];
    float top_lp[JOB_MAX_TOP];
    size_t len;
    char text[];                     /* (len + 1) complete UTF-8, NUL-terminated */
};

struct job_sub {                     /* one engine request (one prompt) */
    struct job *job;
    int prompt;
    uint64_t id;
    bool added;                      /* the engine holds a reference (HTTP thread only) */
    int n_finished;                  /* under job->mu */
    bool got_first;                  /* engine thread only */
};

struct job {
    struct server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                        /* under mu */
    atomic_bool cancelled;           /* the HTTP side stopped listening: events are dropped */
    bool lost;                       /* an event could not be queued (out of memory); under mu */
    struct job_event *head, **tail;  /* under mu */
    int n_prompts, n, n_vocab;
    int logprobs;                    /* -1: none; else alternatives per position (0..JOB_MAX_TOP) */
    struct job_sub *subs;            /* (n_prompts) */
    double t_arrival;                /* time_now() when the request arrived */
    double *t_last;                  /* (n_prompts * n) previous token time per choice; engine thread only */
    double next_check;               /* when job_wait next looks at the client's socket; HTTP side only */
};

/* A job with n_prompts empty slots; NULL when out of memory.  The caller
 * holds the HTTP reference. */
struct job *job_new(struct server *s, int n_prompts, int n, int n_vocab, int logprobs, double t_arrival);

/* Queue prompt k with the engine (on_event / user are filled in here).
 * Returns 0 or kvllm_engine_add's error (nothing queued then). */
int job_submit(struct job *j, int k, struct kvllm_request *r);

enum { JOB_EVENT = 0, JOB_GONE = 1 };
/* Wait for the next event; fd is the client's socket, polled meanwhile.
 * Returns JOB_EVENT with *out (the caller frees it), or JOB_GONE when the
 * client disconnected or the server is stopping. */
int job_wait(struct job *j, int fd, struct job_event **out);

/* The HTTP side is done: samples still running are aborted, queued events
 * dropped, and the HTTP reference released (the job may be freed). */
void job_release(struct job *j);

/* The engine's event callback (engine thread). */
void job_on_event(const struct kvllm_event *ev, void *user);

/* Whether the client on fd has closed its end. */
bool job_client_gone(int fd);

#endif
