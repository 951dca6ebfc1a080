/* step_layout.h — one step's inputs packed for a single upload: where each
 * array lies in the packed buffer, the same in the host staging memory the
 * engine fills and in the backend buffer it is uploaded to, so one copy of
 * the used prefix moves them all.
 *
 * Layout (byte offsets, each a multiple of STEP_ALIGN):
 *   tok, pos, slot, seq        (n_tokens int32 each)
 *   win_slot                   (n_tokens int32) with a sliding-window pool, else absent
 *   rows                       (n_logits int32) rows whose logits are wanted
 *   table                      (n_rows, stride) dense block tables, a sequence a row
 *   win_table                  (n_rows, stride) the window pool's, else absent
 * Every offset depends on the counts alone, so a step of the same counts
 * finds its arrays where a recorded op list (graph.h) expects them.  A
 * step's sequences fill the first rows of each table; the bytes through
 * the last table row it uses are the prefix to upload (step_layout_used).
 *
 * Pure arithmetic: nothing allocates; sizes are checked for overflow. */
#ifndef KVLLM_STEP_LAYOUT_H
#define KVLLM_STEP_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STEP_ALIGN 64   /* a cache line; a GPU's vector loads need 16 */

struct step_layout {
    int n_tokens, n_logits, n_rows, stride;
    bool win;
    size_t tok, pos, slot, seq, win_slot, rows, table, win_table;   /* win_*: 0 without a window pool */
    size_t bytes;                 /* the whole buffer */
};

/* KVLLM_EINVAL for a negative count, KVLLM_ERANGE when the sizes overflow. */
int step_layout(int n_tokens, int n_logits, int n_rows, int stride, bool win, struct step_layout *l);
/* The bytes through the last table row of a step of n_seqs (<= n_rows) sequences. */
size_t step_layout_used(const struct step_layout *l, int n_seqs);

#endif
