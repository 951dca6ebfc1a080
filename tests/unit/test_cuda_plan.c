/* test_cuda_plan.c — the CUDA backend's host-side arithmetic (cuda_plan.c),
 * on the CPU: padded CUDA-graph batch sizes, the packed step inputs, the
 * attention split plan and the device memory plan.  Needs no GPU and runs
 * in every build. */
#include "check.h"

#include "backend/cuda/cuda_plan.h"
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_graph_sizes(void) {
    int s[CUDA_GRAPH_MAX_SIZES];
    int n = cuda_graph_sizes(32, s, CUDA_GRAPH_MAX_SIZES);
    const int want32[] = { 1, 2, 4, 8, 16, 32 };
    CHECK(n == 6 && memcmp(s, want32, sizeof want32) == 0);
    n = cuda_graph_sizes(1, s, CUDA_GRAPH_MAX_SIZES);
    CHECK(n == 1 && s[0] == 1);
    n = cuda_graph_sizes(48, s, CUDA_GRAPH_MAX_SIZES);
    const int want48[] = { 1, 2, 4, 8, 16, 32, 48 };
    CHECK(n == 7 && memcmp(s, want48, sizeof want48) == 0);
    n = cuda_graph_sizes(INT32_MAX, s, CUDA_GRAPH_MAX_SIZES);
    CHECK(n == 32 && s[30] == 1 << 30 && s[31] == INT32_MAX);
    CHECK(cuda_graph_sizes(0, s, CUDA_GRAPH_MAX_SIZES) == KVLLM_EINVAL);
    CHECK(cuda_graph_sizes(32, s, 5) == KVLLM_EINVAL);      /* six sizes, room for five */
    CHECK(cuda_graph_sizes(32, s, 6) == 6);

    /* every n maps to the smallest captured size >= n */
    for (int max = 1; max <= 300; max++) {
        n = cuda_graph_sizes(max, s, CUDA_GRAPH_MAX_SIZES);
        CHECK(n > 0);
        for (int b = 1; b <= max; b++) {
            int want = -1;
            for (int i = 0; i < n && want < 0; i++)
                if (s[i] >= b) want = s[i];
            const int got = cuda_graph_batch(b, max);
            CHECK_MSG(got == want, "cuda_graph_batch(%d, %d) = %d, want %d", b, max, got, want);
        }
    }
    CHECK(cuda_graph_batch(3, 32) == 4 && cuda_graph_batch(17, 32) == 32 && cuda_graph_batch(33, 48) == 48);
    CHECK(cuda_graph_batch(0, 8) == KVLLM_EINVAL && cuda_graph_batch(9, 8) == KVLLM_EINVAL);
    CHECK(cuda_graph_batch(1, 0) == KVLLM_EINVAL);
    CHECK(cuda_graph_batch(INT32_MAX, INT32_MAX) == INT32_MAX);
    CHECK(cuda_graph_batch((1 << 30) + 1, INT32_MAX) == INT32_MAX);
}

static void test_step_layout(void) {
    struct cuda_step_layout l;
    CHECK(cuda_step_layout(3, 2, 5, 2, &l) == 0);
    /* 256-aligned arrays in order, each after the previous one's end */
    CHECK(l.ids == 0 && l.pos == 256 && l.slots == 512 && l.seq == 768 && l.block_table == 1024 &&
          l.logit_rows == 1280 && l.bytes == 1288);
    int32_t ids[3] = { 7, 8, 9 }, pos[3] = { 0, 1, 0 }, slots[3] = { 16, 17, -1 }, seq[3] = { 0, 0, 1 };
    int32_t table[10] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, rows[2] = { 1, 2 };
    uint8_t *buf = malloc(l.bytes);
    memset(buf, 0xab, l.bytes);
    cuda_step_pack(&l, buf, ids, pos, slots, seq, table, rows);
    CHECK(memcmp(buf + l.ids, ids, sizeof ids) == 0 && memcmp(buf + l.pos, pos, sizeof pos) == 0);
    CHECK(memcmp(buf + l.slots, slots, sizeof slots) == 0 && memcmp(buf + l.seq, seq, sizeof seq) == 0);
    CHECK(memcmp(buf + l.block_table, table, sizeof table) == 0 && memcmp(buf + l.logit_rows, rows, sizeof rows) == 0);
    int pad_dirty = 0;   /* the gaps are zeroed */
    for (size_t i = 12; i < 256; i++) pad_dirty += buf[i] != 0;
    for (size_t i = l.block_table + sizeof table; i < l.logit_rows; i++) pad_dirty += buf[i] != 0;
    CHECK(pad_dirty == 0);
    free(buf);

    CHECK(cuda_step_layout(0, 0, 0, 0, &l) == 0 && l.bytes == 0);
    CHECK(cuda_step_layout(1, 0, 0, 0, &l) == 0 && l.bytes == 1024 && l.pos == 256 && l.logit_rows == 1024);
    CHECK(cuda_step_layout(-1, 1, 1, 1, &l) == KVLLM_EINVAL);
    CHECK(cuda_step_layout(1, 1, 1, -1, &l) == KVLLM_EINVAL);
    /* 2^31 x 2^31 int32 of block table: overflows size_t arithmetic only on 32-bit; the offsets stay exact */
    int rc = cuda_step_layout(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, &l);
    CHECK(rc == 0 || rc == KVLLM_ERANGE);
    if (rc == 0) CHECK(l.block_table % CUDA_STEP_ALIGN == 0 && l.bytes > (size_t)INT32_MAX * INT32_MAX);
}

static void test_attn(void) {
    CHECK(cuda_attn_splits(0) == 0 && cuda_attn_splits(1) == 1 && cuda_attn_splits(PAGED_ATTN_SPLIT) == 1);
    CHECK(cuda_attn_splits(PAGED_ATTN_SPLIT + 1) == 2 && cuda_attn_splits(131072) == 131072 / PAGED_ATTN_SPLIT);
    CHECK(cuda_attn_splits(INT32_MAX) == (INT32_MAX - 1) / PAGED_ATTN_SPLIT + 1);
    /* 40 tokens of 32 heads of 128 over 2200 positions: 9 partitions of 256 (the generic kernel's 3
     * splits of 1024 fit in them) of (m, l, acc[128]) */
    CHECK(cuda_attn_slots(2200) == 9 && cuda_attn_slots(1) == 1 && cuda_attn_slots(0) == 0);
    CHECK(cuda_attn_partial_floats(40, 32, 128, 2200) == 40ull * 32 * 9 * 130);
    CHECK(cuda_attn_partial_floats(0, 32, 128, 2200) == 0 && cuda_attn_partial_floats(1, 1, 1, 0) == 0);
    CHECK(cuda_attn_partial_floats(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX) == 0);   /* overflow */
    /* g = 4 heads of 128, tile 32, 4 warps */
    CHECK(cuda_attn_smem_bytes(4, 128, 32, 4) == 4 * (2 * 4 * 128 + 2 * 4 + 2 * 32 * 129 + 2 * 32 + 4 * 32));
    CHECK(cuda_attn_hd_smem_bytes(4, 128, 32, 4) == cuda_attn_smem_bytes(4, 128, 32, 4) + 8 * 32);
}

/* The head-size kernels' partitions, against their definition position by position: for every
 * span, partitions of cuda_attn_part(span) from the span's start cover it exactly, the last one
 * non-empty; at most CUDA_ATTN_MAX_SPLITS; the grid for ctx_hi covers every span up to it and is
 * reached by one of them. */
static void test_attn_partitions(void) {
    CHECK(cuda_attn_hd_kernel(64) && cuda_attn_hd_kernel(128) && cuda_attn_hd_kernel(256));
    CHECK(!cuda_attn_hd_kernel(8) && !cuda_attn_hd_kernel(96) && !cuda_attn_hd_kernel(512));
    CHECK(cuda_attn_part(1) == CUDA_ATTN_PART && cuda_attn_nsplit(1) == 1);
    CHECK(cuda_attn_nsplit(CUDA_ATTN_PART) == 1 && cuda_attn_nsplit(CUDA_ATTN_PART + 1) == 2);
    const int knee = CUDA_ATTN_PART * CUDA_ATTN_MAX_SPLITS;
    CHECK(cuda_attn_part(knee) == CUDA_ATTN_PART && cuda_attn_nsplit(knee) == CUDA_ATTN_MAX_SPLITS);
    CHECK(cuda_attn_part(knee + 1) == 2 * CUDA_ATTN_PART && cuda_attn_nsplit(knee + 1) == CUDA_ATTN_MAX_SPLITS / 2 + 1);
    CHECK(cuda_attn_part(INT32_MAX) % CUDA_ATTN_PART == 0 && cuda_attn_nsplit(INT32_MAX) <= CUDA_ATTN_MAX_SPLITS);
    int grid = 0, bad = 0;
    for (int span = 1; span <= 3 * knee + 7; span++) {
        const int part = cuda_attn_part(span), ns = cuda_attn_nsplit(span);
        /* partition s: [s part, min(span, (s + 1) part)), as the kernel cuts it */
        bad += part % CUDA_ATTN_PART != 0 || ns < 1 || ns > CUDA_ATTN_MAX_SPLITS || (ns - 1) * part >= span ||
               ns * part < span;
        if (ns > grid) grid = ns;
        bad += cuda_attn_grid_splits(span) != grid;
    }
    CHECK_MSG(bad == 0, "%d spans with a partition plan off its definition", bad);
    CHECK(cuda_attn_grid_splits(0) == 0 && cuda_attn_grid_splits(INT32_MAX) == CUDA_ATTN_MAX_SPLITS);
}

static struct cuda_mem_in llama8b(void) {
    return (struct cuda_mem_in){ .weight_bytes = 16060522496ull, .free_bytes = 140ull << 30, .n_layer = 32,
                                 .n_head = 32, .n_head_kv = 8, .head_dim = 128, .n_embd = 4096, .n_ff = 14336,
                                 .n_vocab = 128256, .kv_type = KV_F16, .block_size = 16, .max_tokens = 512,
                                 .max_seqs = 32, .max_ctx = 8192 };
}

static void test_mem_plan(void) {
    struct cuda_mem_in in = llama8b();
    struct cuda_mem_plan p;
    CHECK(cuda_mem_plan(&in, &p) == 0);
    /* Llama-3-8B, f16 KV: 32 layers x 2 x 8 heads x 128 x 2 bytes = 128 KiB per token */
    CHECK(p.kv_bytes_per_token == 131072);
    CHECK(p.n_graphs == 6 && p.graphs == 6ull * (8 << 20));
    CHECK(p.budget == (uint64_t)((double)(140ull << 30) * 0.9));
    CHECK(p.fits && p.total <= p.budget && p.kv_bytes == p.kv_blocks * 16 * 131072);
    CHECK(p.total + 16 * 131072 > p.budget);                  /* one more block would not fit */
    const uint64_t act = 512ull * 4 * (3 * 4096 + 2 * 32 * 128 + 2 * 8 * 128 + 2 * 14336) + 32ull * 4 * 128256 +
                         4ull * 512 * 32 * 32 * 130 + 512ull * (14336 + 14336 / 8);
    CHECK(p.activations > act && p.activations < act + (1 << 20));   /* plus the packed step inputs */

    /* int8 KV: 1 byte per element plus a float scale per row */
    in.kv_type = KV_INT8;
    CHECK(cuda_mem_plan(&in, &p) == 0 && p.kv_bytes_per_token == 32ull * 2 * 8 * (128 + 4));
    in.kv_type = KV_FP8;
    CHECK(cuda_mem_plan(&in, &p) == 0 && p.kv_bytes_per_token == 32ull * 2 * 8 * (128 + 4));
    in.kv_type = KV_F32;
    CHECK(cuda_mem_plan(&in, &p) == 0 && p.kv_bytes_per_token == 32ull * 2 * 8 * 128 * 4);

    /* a fixed pool, rounded up to whole blocks */
    in = llama8b();
    in.kv_tokens = 1000;
    CHECK(cuda_mem_plan(&in, &p) == 0 && p.kv_blocks == 63 && p.kv_bytes == 63ull * 16 * 131072);
    CHECK(!p.fits == (p.total > p.budget || p.kv_blocks < 32));
    /* too little memory: the weights alone exceed the budget */
    in = llama8b();
    in.free_bytes = 16ull << 30;
    CHECK(cuda_mem_plan(&in, &p) == 0 && !p.fits && p.kv_blocks == 0);
    in.kv_tokens = 16;
    CHECK(cuda_mem_plan(&in, &p) == 0 && !p.fits);
    /* a fraction */
    in = llama8b();
    in.mem_fraction = 0.5;
    CHECK(cuda_mem_plan(&in, &p) == 0 && p.budget == 70ull << 30 && p.total <= p.budget);

    /* nonsense */
    in = llama8b();
    in.n_head_kv = 5;
    CHECK(cuda_mem_plan(&in, &p) == KVLLM_EINVAL);
    in = llama8b();
    in.kv_type = KV_TYPE_COUNT_;
    CHECK(cuda_mem_plan(&in, &p) == KVLLM_EINVAL);
    in = llama8b();
    in.mem_fraction = 1.5;
    CHECK(cuda_mem_plan(&in, &p) == KVLLM_EINVAL);
    in = llama8b();
    in.block_size = 0;
    CHECK(cuda_mem_plan(&in, &p) == KVLLM_EINVAL);
    /* overflow */
    in = llama8b();
    in.n_layer = INT32_MAX;
    in.head_dim = INT32_MAX;
    in.kv_type = KV_F32;
    CHECK(cuda_mem_plan(&in, &p) == KVLLM_ERANGE);
    in = llama8b();
    in.kv_tokens = INT64_MAX;
    CHECK(cuda_mem_plan(&in, &p) == KVLLM_ERANGE);
}

int main(void) {
    test_graph_sizes();
    test_step_layout();
    test_attn();
    test_attn_partitions();
    test_mem_plan();
    return check_report("test_cuda_plan");
}
