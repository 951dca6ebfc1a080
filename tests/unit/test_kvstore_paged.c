/* test_kvstore_paged.c — the paged KV storage: layout and alignment of every
 * type, block copies (the backend's copy_blocks op: data and scales) for
 * copy-on-write, sizes, errors.  The CPU backend's memory is host memory,
 * so the test may fill and read it directly. */
#include "check.h"
#include "kv/paged_kv.h"
#include "core/core.h"
#include <stdio.h>
#include <string.h>
int main(void) {
    struct paged_kv c;
    struct backend *be = NULL;
    CHECK(backend_cpu_new("scalar", false, BACKEND_ACT_Q8, &be) == 0);
    if (!be) return check_report("test_kvstore_paged");
    struct backend_ctx_params cp = { .n_threads = 1, .max_tokens = 1, .max_ctx = 1, .n_head = 1, .head_dim = 1,
                                     .max_cols = 1 };
    struct backend_ctx *ctx = NULL;
    CHECK(backend_ctx_new(be, &cp, &ctx) == 0);
    for (int t = 0; t < KV_TYPE_COUNT_; t++) {
        CHECK(kv_type_parse(kv_type_name(t)) == t);
        int rc = paged_kv_init(&c, be, t, 3, 10, 7, 3, 40);
        CHECK(rc == 0);
        if (rc) continue;
        size_t esz = t == 0 ? 4 : t < 3 ? 2 : 1;
        for (int il = 0; il < 3; il++) {
            struct kv_layer_view *l = &c.layers[il];
            CHECK((uintptr_t)l->k % 64 == 0 && (uintptr_t)l->v % 64 == 0);
            CHECK(!!l->k_scale == (t >= 3));
            if (l->k_scale) CHECK((uintptr_t)l->k_scale % 64 == 0 && (uintptr_t)l->v_scale % 64 == 0);
            size_t n = (size_t)10 * 7 * 3 * 40 * esz;
            memset(l->k, il + 1, n); memset(l->v, il + 2, n);
            if (l->k_scale) { for (int i = 0; i < 10*7*3; i++) { l->k_scale[i] = i; l->v_scale[i] = -i; } }
            /* mark block 4 distinctly */
            memset((char *)l->k + 4 * n / 10, 0x55, n / 10);
        }
        const int32_t pairs[2][2] = { { 8, 4 }, { 6, 6 } };   /* the second copies a block onto itself: nothing */
        CHECK(BE_OP(ctx, copy_blocks, c.layers, c.n_layer, pairs, 2) == 0 && backend_sync(ctx) == 0);
        for (int il = 0; il < 3; il++) {
            struct kv_layer_view *l = &c.layers[il];
            size_t n = (size_t)10 * 7 * 3 * 40 * esz;
            CHECK(memcmp((char *)l->k + 8 * n / 10, (char *)l->k + 4 * n / 10, n / 10) == 0);
            CHECK(((unsigned char *)l->k)[9 * n / 10] == il + 1);
            if (l->k_scale) CHECK(l->k_scale[8 * 21] == 4 * 21 && l->v_scale[8 * 21 + 20] == -(4 * 21 + 20));
        }
        printf("%s: %llu bytes/token\n", kv_type_name(t), (unsigned long long)paged_kv_bytes_per_token(t, 3, 3, 40));
        paged_kv_deinit(&c);
        paged_kv_deinit(&c);
    }
    CHECK(paged_kv_bytes_per_token(KV_F16, 32, 8, 128) == 2ull * 32 * 8 * 256);
    CHECK(paged_kv_bytes_per_token(KV_INT8, 32, 8, 128) == 2ull * 32 * 8 * 132);
    CHECK(kv_type_parse("fp16") == -1 && kv_type_parse(NULL) == -1 && strcmp(kv_type_name(99), "?") == 0);
    CHECK(paged_kv_init(&c, be, KV_F32, 1000, 1 << 30, 1 << 20, 64, 128) == KVLLM_ERANGE);
    CHECK(paged_kv_init(&c, be, KV_F32, 1000, 1 << 20, 16, 64, 128) == KVLLM_ENOMEM);
    CHECK(paged_kv_init(&c, be, KV_F32, 0, 1, 16, 64, 128) == KVLLM_EINVAL);
    CHECK(paged_kv_bytes(KV_F16, 2, 3, 16, 4, 64) == 2ull * 2 * 3 * 16 * 4 * 64 * 2);
    backend_ctx_free(ctx);
    backend_free(be);
    return check_report("test_kvstore_paged");
}
