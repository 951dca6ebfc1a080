/* job.h — one HTTP completion request on its way through the engine.
 *
 * Model: a job owns one engine request per prompt, each with n samples;
 * choice c = prompt * n + sample.  The engine thread reports through
 * job_on_event, which copies every event (text, and log-probabilities when
 * asked) into the job's queue; the HTTP thread drains the queue.  A job is
 * reference-counted: one reference for the HTTP side and one per engine
 * request until that request's last sample has delivered its finishing event.
 * So the engine never calls into freed memory after a client left, and the
 * HTTP side never waits on a request the engine already forgot.
 *
 * No thread waits on a job: the HTTP side drains the queue (job_pop) and,
 * when it is empty, suspends its MHD connection (job_suspend); the engine
 * thread resumes it when there is something to do — every event for a
 * stream, the last finishing event for a whole response.  The connection
 * watcher (http.c) reports a client that left (job_client_gone) or
 * half-closed (job_probe), and shutdown cancels what still runs
 * (job_shutdown). */
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
struct peer;
struct MHD_Connection;

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
    int refs;                        /* under mu */
    atomic_bool cancelled;           /* the HTTP side stopped listening: events are dropped */
    bool lost;                       /* an event could not be queued (out of memory); under mu */
    struct job_event *head, **tail;  /* under mu */
    int n_prompts, n, n_vocab;
    int logprobs;                    /* -1: none; else alternatives per position (0..JOB_MAX_TOP) */
    struct job_sub *subs;            /* (n_prompts) */
    double t_arrival;                /* time_now() when the request arrived */
    double t_first;                  /* when its first token came (0: none yet); engine thread, read after the end */
    double *t_last;                  /* (n_prompts * n) previous token time per choice; engine thread only */

    /* waking the HTTP side; under mu */
    bool stream;                     /* wake on every event, not only when all choices finished */
    int n_left;                      /* choices without their finishing event */
    bool suspended;                  /* conn is suspended, waiting for us */
    struct MHD_Connection *conn;
    int fd;                          /* the client's socket (-1: unknown) */
    bool http11;                     /* a 1xx interim response may be sent */
    bool probed;                     /* the client half-closed and was probed */
    bool ping;                       /* a stream should write an SSE comment (the probe) */
    bool drained;                    /* pipelined bytes were read and dropped: close after this answer */
    atomic_bool gone;                /* the client closed its connection */
    atomic_bool shutdown;            /* cancelled because the server is stopping */
    struct peer *peer;               /* the watched connection; under srv->peers_mu */
};

/* A job with n_prompts empty slots; NULL when out of memory.  The caller
 * holds the HTTP reference.  stream: wake the HTTP side on every event. */
struct job *job_new(struct server *s, int n_prompts, int n, int n_vocab, int logprobs, double t_arrival, bool stream);

/* Queue prompt k with the engine (on_event / user are filled in here).
 * Returns 0 or kvllm_engine_add's error (nothing queued then), its message
 * in err (err_cap bytes). */
int job_submit(struct job *j, int k, struct kvllm_request *r, char *err, size_t err_cap);

/* The next queued event (the caller frees it), or NULL. */
struct job_event *job_pop(struct job *j);
/* Whether an event was lost (out of memory): the answer cannot be whole. */
bool job_lost(struct job *j);
/* Suspend c until the engine has something for it; false (nothing
 * suspended) when that is already the case, or the client is gone, or a
 * probe is due.  Only from c's MHD callbacks. */
bool job_suspend(struct job *j, struct MHD_Connection *c);
/* A stream's probe is due (cleared by reading). */
bool job_take_ping(struct job *j);

/* Abort every sample still running (thread-safe; their finishing events
 * follow within a step). */
void job_cancel(struct job *j);
/* The client closed its connection: cancel and wake the HTTP side. */
void job_client_gone(struct job *j);
/* The client half-closed: find out whether it still listens by writing to it
 * (a 100 Continue, or an SSE comment for a stream); a client that closed
 * answers with a reset, which the watcher sees.  Idempotent. */
void job_probe(struct job *j);
/* The client pipelined bytes behind a request that waits: see job.c.
 * Idempotent; from the watcher. */
void job_drain(struct job *j);
/* The connection must close after this answer (job_drain dropped what the
 * client pipelined). */
bool job_drained(struct job *j);
/* The server is stopping: cancel, answered as a shutdown. */
void job_shutdown(struct job *j);

/* Reference counting for other holders (the connection watcher). */
void job_ref(struct job *j);
void job_unref(struct job *j);

/* The HTTP side is done: the connection is no longer watched, samples still
 * running are aborted, queued events dropped, and the HTTP reference
 * released (the job may be freed). */
void job_release(struct job *j);

/* The engine's event callback (engine thread). */
void job_on_event(const struct kvllm_event *ev, void *user);

#endif
