/* grammar.h — constrained sampling: a grammar (from GBNF or a JSON Schema),
 * a vocabulary index built once per model, and a matcher per sequence that
 * says which tokens may come next.
 *
 * Model of the world:
 *   struct kvllm_grammar (kvllm.h)  compiled rules; immutable, refcounted.
 *   struct gvocab                   every token's bytes in a trie, built once
 *                                   per model from the tokenizer; immutable,
 *                                   shared by all matchers of that model.
 *   struct gmatcher                 one per constrained sequence: the stacks
 *                                   of a byte-level pushdown automaton.
 * A matcher never allocates in gmatcher_fill_mask / gmatcher_accept after
 * gmatcher_new has sized it (the engine step allocates nothing).
 * Depends on core only (json-c for JSON Schema input). */
#ifndef KVLLM_GRAMMAR_H
#define KVLLM_GRAMMAR_H

#include "kvllm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gvocab;
struct gmatcher;

/* The GBNF text the grammar was compiled from (a JSON Schema's generated
 * rules); valid while g is. */
const char *grammar_gbnf_text(const struct kvllm_grammar *g);

/* tok_bytes[i] / tok_len[i]: the raw bytes token i stands for mid-text
 * (kvllm_token_to_bytes); a control token has is_special[i] true and is
 * never allowed by a grammar, except the end tokens end_ids[0..n_end)
 * (EOS, <|im_end|>, <|eot_id|>...) which are allowed exactly when the
 * grammar has accepted a complete string.  Copies what it needs. */
int gvocab_new(int n_vocab, const char *const *tok_bytes, const size_t *tok_len, const bool *is_special,
               const int32_t *end_ids, int n_end, struct gvocab **out);
void gvocab_free(struct gvocab *v);
int gvocab_n_vocab(const struct gvocab *v);

/* g and v must outlive the matcher (the engine holds a grammar reference).
 * Sizes every working store (about 8 MB); fill_mask and accept then never
 * allocate, and fail with KVLLM_ERANGE (logged, state unchanged) if a
 * grammar outgrows them.  Matchers of one grammar share the masks' context
 * cache through the grammar (internally locked): any thread may run any
 * matcher, one thread per matcher at a time. */
int gmatcher_new(const struct kvllm_grammar *g, const struct gvocab *v, struct gmatcher **out);
void gmatcher_free(struct gmatcher *m);

/* Most of a matcher's memory (about 6 MB of hash tables and sets) is working
 * store that every call resets: matchers that one thread runs in turn may
 * share one (struct gscratch), so each keeps only its state (its history of
 * GMATCHER_HISTORY + 1 states, ~0.5 MB, and its context cache).  A matcher
 * made by gmatcher_new_shared has no grammar until gmatcher_reset gives it
 * one, and may be reset to another grammar when its sequence is done (the
 * engine keeps a pool of them).  s must outlive the matcher; the caller
 * ensures no two of its matchers run at once. */
struct gscratch;
int gscratch_new(struct gscratch **out);
void gscratch_free(struct gscratch *s);
int gmatcher_new_shared(const struct gvocab *v, struct gscratch *s, struct gmatcher **out);
/* Start over on grammar g (which must outlive this use): the state at g's
 * start, the cache emptied, nothing allocated.  KVLLM_ERANGE (logged) when
 * g's start exceeds the matcher's capacity; the matcher then has no usable
 * state until the next reset. */
int gmatcher_reset(struct gmatcher *m, const struct kvllm_grammar *g);
/* Make g's shared context store for v now (it is made by the first matcher
 * otherwise), so that a reset later allocates nothing. */
void gmatcher_prepare(const struct kvllm_grammar *g, const struct gvocab *v);
/* allow: (n_vocab + 31) / 32 words; bit (id & 31) of word id >> 5 is set
 * when token id may come next.  Returns the number of allowed tokens (0:
 * nothing can follow — the caller ends the sequence) or < 0. */
int gmatcher_fill_mask(struct gmatcher *m, uint32_t *allow);
/* Advance by one token; KVLLM_EINVAL (state unchanged) if it is not allowed. */
int gmatcher_accept(struct gmatcher *m, int32_t token);
/* The tokens accepted so far form a complete string of the grammar. */
bool gmatcher_can_end(const struct gmatcher *m);
/* Nothing but an end token can follow: the sequence may finish now. */
bool gmatcher_must_end(const struct gmatcher *m);
/* Undo the last n accepted tokens (speculative decoding); n <= accepted
 * tokens since gmatcher_new, and at most GMATCHER_HISTORY (32): the matcher
 * keeps that many past states.  KVLLM_EINVAL (state unchanged) beyond. */
#define GMATCHER_HISTORY 32
int gmatcher_rollback(struct gmatcher *m, int n);

#endif
