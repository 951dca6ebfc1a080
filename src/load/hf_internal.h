/* hf_internal.h — helpers shared by hf.c (model folders) and
 * hf_tokenizer.c (tokenizer.json).  Not part of the module's interface:
 * only src/load/hf*.c include it. */
#ifndef KVLLM_HF_INTERNAL_H
#define KVLLM_HF_INTERNAL_H

#include <json-c/json.h>

/* Parse a whole JSON file whose top level must be an object; logs
 * "<path>: malformed JSON: ..." and returns KVLLM_EFORMAT (or KVLLM_EIO,
 * KVLLM_ENOMEM) on failure, *out NULL.  The caller owns *out
 * (json_object_put). */
int hf_read_json(const char *path, json_object **out);

/* dir + "/" + name, malloc'd (NULL on OOM). */
char *hf_path_join(const char *dir, const char *name);

#endif
