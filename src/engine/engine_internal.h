/* engine_internal.h — what api.c and engine.c share. */
#ifndef KVLLM_ENGINE_INTERNAL_H
#define KVLLM_ENGINE_INTERNAL_H

#include "kvllm.h"
#include "model/model.h"
#include "tok/tokenizer.h"

struct kvllm_model {
    struct model *m;
    struct tokenizer *tok;     /* NULL when the model carries no vocabulary */
    struct kvllm_model_desc desc;
    char path[512];
};

#endif
