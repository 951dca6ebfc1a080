/* bigram_heap.h — the priority queue both BPE encoders merge with (spm.c:
 * SentencePiece scores, bpe.c: merge ranks).  Candidate pairs of adjacent
 * symbols, lowest priority first, ties to the leftmost pair; a popped entry
 * whose symbols changed since it was queued (size no longer matches) is
 * stale and skipped by the caller. */
#ifndef KVLLM_BIGRAM_HEAP_H
#define KVLLM_BIGRAM_HEAP_H

#include <stdbool.h>
#include <stdint.h>

struct bigram {
    float prio;      /* lower merges first: -score (SentencePiece) or rank (byte-level BPE) */
    int left, right; /* symbol indices */
    uint32_t size;   /* bytes of left+right when queued */
};

static inline bool bigram_before(const struct bigram *a, const struct bigram *b) {
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

/* heap holds room for every push (the callers size it 2 x symbols). */
static inline void bigram_push(struct bigram *heap, int *n, struct bigram b) {
    int i = (*n)++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!bigram_before(&b, &heap[parent])) break;
        heap[i] = heap[parent];
        i = parent;
    }
    heap[i] = b;
}

static inline struct bigram bigram_pop(struct bigram *heap, int *n) {
    struct bigram top = heap[0], last = heap[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && bigram_before(&heap[c + 1], &heap[c])) c++;
        if (!bigram_before(&heap[c], &last)) break;
        heap[i] = heap[c];
        i = c;
    }
    if (*n > 0) heap[i] = last;
    return top;
}

#endif
