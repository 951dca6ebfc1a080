/* constrain.c — grammars in the engine.  Until the grammar module is in the
 * build, a request with a grammar is refused at add (KVLLM_EUNSUPPORTED,
 * logged), so nothing below ever runs for a sequence; the real glue (a
 * matcher per sample, the vocabulary index) replaces this file when
 * src/grammar lands. */
#include "engine/engine_internal.h"
#include "core/core.h"

struct kvllm_grammar *constrain_ref(const struct kvllm_grammar *g) { return (struct kvllm_grammar *)g; }

void constrain_unref(struct kvllm_grammar *g) { (void)g; }

int constrain_seq_new(struct kvllm_engine *e, const struct request *r, struct seq_ctx *c) {
    (void)e;
    (void)c;
    if (!r->grammar) return 0;
    LOG_ERR("grammars (constrained decoding) are not in this build yet");
    return KVLLM_EUNSUPPORTED;
}

void constrain_seq_free(struct seq_ctx *c) { (void)c; }
void constrain_engine_free(struct kvllm_engine *e) { (void)e; }
int constrain_fill(struct seq_ctx *c) { (void)c; return KVLLM_EUNSUPPORTED; }
int constrain_accept(struct seq_ctx *c, int32_t tok) { (void)c; (void)tok; return KVLLM_EUNSUPPORTED; }
bool constrain_must_end(const struct seq_ctx *c) { (void)c; return false; }
