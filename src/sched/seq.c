#include "sched/seq.h"
#include "core/core.h"

#include <stdlib.h>
#include <string.h>

struct seq *seq_new(uint64_t id, const int32_t *prompt, int n_prompt, int max_len, int block_size) {
    KV_ASSERT(n_prompt >= 0 && max_len >= n_prompt && max_len >= 1 && block_size >= 1);
    struct seq *s = xcalloc(1, sizeof *s);
    if (!s) return NULL;
    s->max_blocks = (max_len + block_size - 1) / block_size;
    s->tokens = xmalloc((size_t)max_len * sizeof *s->tokens);
    s->blocks = xmalloc(2 * (size_t)s->max_blocks * sizeof *s->blocks);   /* then win_blocks */
    s->hashes = xmalloc((size_t)s->max_blocks * sizeof *s->hashes);
    if (!s->tokens || !s->blocks || !s->hashes) { seq_free(s); return NULL; }
    s->win_blocks = s->blocks + s->max_blocks;
    if (n_prompt) memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    s->id = id;
    s->n_tokens = s->n_prompt = n_prompt;
    s->max_len = max_len;
    s->n_reserved = 1;
    return s;
}

void seq_free(struct seq *s) {
    if (!s) return;
    free(s->tokens);
    free(s->blocks);
    free(s->hashes);
    free(s);
}
