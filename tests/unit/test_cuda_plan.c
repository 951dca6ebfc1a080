/* test_cuda_plan.c — the CUDA backend's host-side arithmetic (cuda_plan.c),
 * on the CPU: padded CUDA-graph batch sizes, the packed step inputs, the
 * attention split plan and the device memory plan; and the 8-bit matmul's
 * unpacking of packed codes (q8_codes.h, the code the kernel runs) against
 * dtype.h's block formats, on random bytes.  Needs no GPU and runs in every
 * build (on the device the byte operations are the CUDA intrinsics, whose
 * documented meaning the host versions here spell out). */
#include "check.h"

#include "backend/cuda/cuda_plan.h"
#include "backend/step_layout.h"
#include "backend/cuda/q8_codes.h"
#include "core/core.h"
#include "tensor/dtype.h"

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
    struct step_layout l;
    CHECK(step_layout(3, 2, 2, 5, false, &l) == 0);
    /* aligned arrays in order, each after the previous one's end; no window arrays */
    CHECK(l.tok == 0 && l.pos == 64 && l.slot == 128 && l.seq == 192 && l.rows == 256 && l.table == 320 &&
          l.bytes == 360 && l.win_slot == 0 && l.win_table == 0);
    CHECK(step_layout_used(&l, 1) == 340 && step_layout_used(&l, 2) == 360 && step_layout_used(&l, 0) == 264);
    CHECK(step_layout(3, 2, 2, 5, true, &l) == 0);
    CHECK(l.win_slot == 256 && l.rows == 320 && l.table == 384 && l.win_table == 448 && l.bytes == 488);
    CHECK(step_layout_used(&l, 1) == 468);
    CHECK(step_layout(0, 0, 0, 0, false, &l) == 0 && l.bytes == 0);
    CHECK(step_layout(1, 0, 0, 0, false, &l) == 0 && l.pos == 64 && l.rows == 256 && l.bytes == 256);
    CHECK(step_layout(-1, 1, 1, 1, false, &l) == KVLLM_EINVAL);
    CHECK(step_layout(1, 1, 1, -1, false, &l) == KVLLM_EINVAL);
    /* 2^31 x 2^31 int32 of block table: overflows size_t arithmetic only on 32-bit; the offsets stay exact */
    int rc = step_layout(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, true, &l);
    CHECK(rc == 0 || rc == KVLLM_ERANGE);
    if (rc == 0) CHECK(l.win_table % STEP_ALIGN == 0 && l.bytes > (size_t)INT32_MAX * INT32_MAX);
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

/* The head-size kernels' walk over KV blocks (cuda_attn_walk_*), run for 32 lanes as warp 0 runs it:
 * every tile's position c + j (j < its count) gets KV block (c + j) / bs and offset (c + j) % bs, its
 * id from a lane that read the table for that very block, and the table is read once per KV block
 * a tile touches. */
static void test_attn_walk(void) {
    enum { TILE = 32 };
    static const int bss[] = { 1, 2, 3, 5, 7, 16, 31, 32, 33, 64, 100 };
    int bad = 0, reads_bad = 0;
    for (size_t bi = 0; bi < sizeof bss / sizeof *bss; bi++) {
        const int bs = bss[bi];
        for (int p0 = 0; p0 < 300; p0 += 1 + p0 / 7) {
            for (int len = 1; len <= 200; len += 1 + len / 5) {
                const int p1 = p0 + len;
                struct cuda_attn_walk w[TILE];
                for (int j = 0; j < TILE; j++) w[j] = cuda_attn_walk_start(p0, j, bs);
                for (int c = p0; c < p1; c += TILE) {
                    const int nt = p1 - c < TILE ? p1 - c : TILE;
                    int read_blk[TILE], n_reads = 0;
                    for (int j = 0; j < TILE; j++) {
                        read_blk[j] = -1;
                        if (j < nt && cuda_attn_walk_reads(w[j], j)) {
                            read_blk[j] = w[j].blk;   /* table[blk] stands for the id */
                            n_reads++;
                        }
                    }
                    for (int j = 0; j < nt; j++) {
                        const int p = c + j, src = cuda_attn_walk_src(w[j], j);
                        bad += w[j].blk != p / bs || w[j].off != p % bs || src < 0 || src > j ||
                               read_blk[src] != p / bs;
                    }
                    reads_bad += n_reads != (c + nt - 1) / bs - c / bs + 1;
                    for (int j = 0; j < TILE; j++) cuda_attn_walk_next(&w[j], TILE, bs);
                }
            }
        }
    }
    CHECK_MSG(bad == 0, "%d positions walked to the wrong KV block, offset or table read", bad);
    CHECK_MSG(reads_bad == 0, "%d tiles read the block table other than once per KV block", reads_bad);
}

/* ---- the 8-bit matmul's codes ---- */

static uint64_t g_rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {   /* xorshift64* */
    g_rs ^= g_rs >> 12;
    g_rs ^= g_rs << 25;
    g_rs ^= g_rs >> 27;
    return (uint32_t)((g_rs * 0x2545f4914f6cdd1dull) >> 32);
}
static void rnd_bytes(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd32();
}
static int lane_byte(int v, int k) { return (int8_t)(uint8_t)((uint32_t)v >> (8 * k)); }

/* Weight code e (< 32) of a 32-block as qmm.h defines w, from dtype.h's layouts. */
static int ref_code32(uint32_t type, const uint8_t *blk, int e) {
    if (type == DTYPE_Q8_0) return ((const struct block_q8_0 *)(const void *)blk)->qs[e];
    const uint8_t *qs = type == DTYPE_Q4_0     ? ((const struct block_q4_0 *)(const void *)blk)->qs
                        : type == DTYPE_Q4_1   ? ((const struct block_q4_1 *)(const void *)blk)->qs
                        : type == DTYPE_Q5_0   ? ((const struct block_q5_0 *)(const void *)blk)->qs
                        : type == DTYPE_Q5_1   ? ((const struct block_q5_1 *)(const void *)blk)->qs
                        : type == DTYPE_IQ4_NL ? ((const struct block_iq4_nl *)(const void *)blk)->qs
                                               : ((const struct block_mxfp4 *)(const void *)blk)->qs;
    int q = e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4;
    if (type == DTYPE_IQ4_NL) return kvalues_iq4nl[q];
    if (type == DTYPE_MXFP4) return kvalues_mxfp4[q];
    if (type == DTYPE_Q5_0 || type == DTYPE_Q5_1) {
        const uint8_t *qh = type == DTYPE_Q5_0 ? ((const struct block_q5_0 *)(const void *)blk)->qh
                                               : ((const struct block_q5_1 *)(const void *)blk)->qh;
        q |= ((qh[e / 8] >> (e % 8)) & 1) << 4;
    }
    return q - (type == DTYPE_Q4_0 ? 8 : type == DTYPE_Q5_0 ? 16 : 0);
}

/* Code e (< 256, unsigned) of a Q4_K / Q5_K / Q6_K super-block, from dtype.h's layouts. */
static int ref_code_k(uint32_t type, const uint8_t *blk, int e) {
    if (type == DTYPE_Q6_K) {
        const struct block_q6_K *b = (const struct block_q6_K *)(const void *)blk;
        const int h = e / 128, s = (e % 128) / 32, l = e % 32;
        return ((b->ql[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0xf) | ((b->qh[32 * h + l] >> (2 * s)) & 3) << 4;
    }
    const int c = e / 64, hi = (e % 64) / 32, l = e % 32;
    const uint8_t *qs = type == DTYPE_Q4_K ? ((const struct block_q4_K *)(const void *)blk)->qs
                                           : ((const struct block_q5_K *)(const void *)blk)->qs;
    int q = hi ? qs[32 * c + l] >> 4 : qs[32 * c + l] & 0xf;
    if (type == DTYPE_Q5_K) q |= ((((const struct block_q5_K *)(const void *)blk)->qh[l] >> (2 * c + hi)) & 1) << 4;
    return q;
}

/* Q2_K / Q3_K code e (< 256) as qmm_k.c uses it (Q2_K 0..3, Q3_K q - 4), from dtype.h's layouts. */
static int ref_code_k2(uint32_t type, const uint8_t *blk, int e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    if (type == DTYPE_Q2_K) return (((const struct block_q2_K *)(const void *)blk)->qs[32 * h + l] >> (2 * s)) & 3;
    const struct block_q3_K *b = (const struct block_q3_K *)(const void *)blk;
    return (((b->qs[32 * h + l] >> (2 * s)) & 3) | ((b->hmask[l] >> (4 * h + s)) & 1) << 2) - 4;
}

static void test_q8_ops(void) {
    int bad = 0;
    for (int it = 0; it < 20000; it++) {
        const uint32_t a = rnd32(), b = rnd32(), c = (rnd32() >> 8) - (1u << 23);   /* |c| < 2^23: no overflow */
        int dot = (int)c, sum = 0;
        uint32_t sub = 0, perm = 0;
        const uint32_t sel = rnd32() & 0x7777u;
        for (int k = 0; k < 4; k++) {
            dot += lane_byte((int)a, k) * lane_byte((int)b, k);
            sum += lane_byte((int)b, k);
            sub |= (uint32_t)(uint8_t)(((a >> (8 * k)) & 0xff) - ((b >> (8 * k)) & 0xff)) << (8 * k);
            const int i = (int)(sel >> (4 * k)) & 7;
            perm |= (uint32_t)(uint8_t)((i < 4 ? a : b) >> (8 * (i & 3))) << (8 * k);
        }
        const int x4[4] = { (int)b, 0, 0, 0 }, c4[4] = { (int)a, 0, 0, 0 };
        bad += q8_dp4a((int)a, (int)b, (int)c) != dot || q8_vsub4(a, b) != sub || q8_byte_perm(a, b, sel) != perm ||
               q8_dot4(c4, x4) != dot - (int)c || q8_sum4(x4) != sum;
        /* four nibbles through the tables */
        const uint32_t nib = rnd32() & 0x0f0f0f0fu;
        uint32_t tbl[4];
        for (int t = 0; t < 2; t++) {
            q8_nl_table(t ? DTYPE_MXFP4 : DTYPE_IQ4_NL, tbl);
            const uint32_t got = q8_nl_lookup(nib, tbl);
            for (int k = 0; k < 4; k++)
                bad += lane_byte((int)got, k) != (t ? kvalues_mxfp4 : kvalues_iq4nl)[(nib >> (8 * k)) & 0xf];
        }
    }
    CHECK_MSG(bad == 0, "%d byte operations off their definition", bad);
}

/* Every unit's unpacked codes (and K-quant scales) equal dtype.h's, on random bytes. */
static void test_q8_codes(void) {
    static const uint32_t t32[] = { DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_IQ4_NL,
                                    DTYPE_MXFP4 };
    uint8_t *buf = malloc(64 * 256);   /* malloc: aligned for every block's loads */
    for (size_t ti = 0; ti < sizeof t32 / sizeof *t32; ti++) {
        const uint32_t type = t32[ti];
        const int bb = q8_blk_bytes(type);
        CHECK((size_t)bb == dtype_block_bytes(type));
        int bad = 0;
        uint32_t tbl[4];
        q8_nl_table(type, tbl);
        for (int it = 0; it < 50; it++) {
            rnd_bytes(buf, 64 * (size_t)bb);
            for (int b = 0; b < 64; b++) {
                int c[8];
                q8_unit32(type, buf + b * bb, tbl, c);
                for (int e = 0; e < 32; e++) bad += lane_byte(c[e / 4], e % 4) != ref_code32(type, buf + b * bb, e);
            }
        }
        CHECK_MSG(bad == 0, "%s: %d codes unpacked off the format", dtype_name(type), bad);
    }
    static const uint32_t tk[] = { DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K, DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_IQ4_XS };
    for (size_t ti = 0; ti < sizeof tk / sizeof *tk; ti++) {
        const uint32_t type = tk[ti];
        const size_t bb = dtype_block_bytes(type);
        int bad = 0;
        for (int it = 0; it < 200; it++) {
            rnd_bytes(buf, 16 * bb);
            for (int b = 0; b < 16; b++) {
                const uint8_t *blk = buf + (size_t)b * bb;
                for (int li = 0; li < 8; li++) {
                    int sc[2];
                    if (type == DTYPE_IQ4_XS) {   /* li: the sub-block of 32 */
                        const struct block_iq4_xs *x = (const struct block_iq4_xs *)(const void *)blk;
                        uint32_t tbl[4];
                        q8_nl_table(DTYPE_IQ4_NL, tbl);
                        int c[8];
                        q8_iq4xs_unit(blk, li, tbl, c, &sc[0]);
                        for (int e = 0; e < 32; e++) {
                            const uint8_t q = x->qs[16 * li + e % 16];
                            bad += lane_byte(c[e / 4], e % 4) != kvalues_iq4nl[e < 16 ? q & 0xf : q >> 4];
                        }
                        bad += sc[0] != (((x->scales_l[li / 2] >> (4 * (li % 2))) & 0xf) |
                                         ((x->scales_h >> (2 * li)) & 3) << 4) - 32;
                        continue;
                    }
                    if (type == DTYPE_Q2_K || type == DTYPE_Q3_K) {
                        int c[8], m[2];
                        q8_q2k_lane(type, blk, li, c, sc, m);
                        for (int e = 0; e < 32; e++) bad += lane_byte(c[e / 4], e % 4) != ref_code_k2(type, blk, 32 * li + e);
                        for (int j = 0; j < 2; j++) {
                            const int sb = 2 * li + j;
                            if (type == DTYPE_Q2_K) {
                                const uint8_t v = ((const struct block_q2_K *)(const void *)blk)->scales[sb];
                                bad += sc[j] != (v & 0xf) || m[j] != v >> 4;
                            } else {
                                bad += sc[j] != q3_K_scale(((const struct block_q3_K *)(const void *)blk)->scales, sb) - 32 ||
                                       m[j] != 0;
                            }
                        }
                        continue;
                    }
                    if (type == DTYPE_Q6_K) {
                        int c[8];
                        q8_q6k_lane(blk, li, c, sc);
                        for (int e = 0; e < 32; e++)
                            bad += lane_byte(c[e / 4], e % 4) != ref_code_k(type, blk, 32 * li + e) - 32;
                        const int8_t *scales = ((const struct block_q6_K *)(const void *)blk)->scales;
                        bad += sc[0] != scales[2 * li] || sc[1] != scales[2 * li + 1];
                        continue;
                    }
                    int lo[4], hi[4], m[2];
                    q8_q4k_lane(type, blk, li, lo, hi, sc, m);
                    const int cc = li / 2, hh = li % 2;
                    for (int e = 0; e < 16; e++) {
                        bad += lane_byte(lo[e / 4], e % 4) != ref_code_k(type, blk, 64 * cc + 16 * hh + e);
                        bad += lane_byte(hi[e / 4], e % 4) != ref_code_k(type, blk, 64 * cc + 32 + 16 * hh + e);
                    }
                    for (int j = 0; j < 2; j++) {
                        uint8_t rsc, rm;
                        q4_K_scale_min(blk + 4, 2 * cc + j, &rsc, &rm);
                        bad += sc[j] != rsc || m[j] != rm;
                    }
                }
            }
        }
        CHECK_MSG(bad == 0, "%s: %d codes or scales unpacked off the format", dtype_name(type), bad);
    }
    free(buf);
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

/* Which steps take the prefill paths, and their scratch: the rules of cuda_plan.h spelled out. */
static void test_prefill_rules(void) {
    CHECK(!cuda_pf_takes(15, 128, true) && cuda_pf_takes(16, 128, true) && cuda_pf_takes(65, 64, true) &&
          cuda_pf_takes(130, 256, true));
    CHECK(!cuda_pf_takes(65, 96, true) && !cuda_pf_takes(65, 80, true) && !cuda_pf_takes(1, 64, true));
    CHECK(!cuda_pf_takes(65, 128, false));   /* KVLLM_ACT=f32: the decode kernels for every step */
    /* head_dim 128: tile rows (8 + 4 bytes each of 64), Q (64 x 136), K (64 x 136), Vt (128 x 72) 16-bit,
     * scales (2 x 64 floats) and three ints per query row */
    CHECK(cuda_pf_smem_bytes(128) == 12 * 64 + 2 * (64 * 136 + 64 * 136 + 128 * 72) + 8 * 64 + 12 * 64);
    CHECK(cuda_pf_smem_bytes(256) == 12 * 32 + 2 * (64 * 264 + 32 * 264 + 256 * 40) + 8 * 32 + 12 * 64);
    CHECK(cuda_pf_smem_bytes(96) == 0);
    /* every instance fits the opt-in shared memory of sm_80 (163 KiB) and sm_90 (227 KiB) */
    CHECK(cuda_pf_smem_bytes(64) < 163 * 1024 && cuda_pf_smem_bytes(256) < 163 * 1024);
    /* GEMMs: 8-bit activation mode only, never the f32-activation matrices, thresholds by type */
    CHECK(cuda_gemm_pick(DTYPE_F16, 0, true, false, 32) == CUDA_GEMM_F16);
    CHECK(cuda_gemm_pick(DTYPE_F16, 0, true, false, 31) == CUDA_GEMM_NONE);
    CHECK(cuda_gemm_pick(DTYPE_BF16, 0, true, false, 200) == CUDA_GEMM_BF16);
    CHECK(cuda_gemm_pick(DTYPE_F16, 0, false, false, 200) == CUDA_GEMM_NONE);
    CHECK(cuda_gemm_pick(DTYPE_F16, TENSOR_F_F32_ACT, true, false, 200) == CUDA_GEMM_NONE);
    CHECK(cuda_gemm_pick(DTYPE_F32, 0, true, false, 200) == CUDA_GEMM_NONE);
    CHECK(cuda_gemm_pick(DTYPE_Q4_0, 0, true, true, 64) == CUDA_GEMM_DEQUANT_F16);
    CHECK(cuda_gemm_pick(DTYPE_Q4_0, 0, true, true, 63) == CUDA_GEMM_NONE);
    CHECK(cuda_gemm_pick(DTYPE_Q4_K, 0, true, false, 500) == CUDA_GEMM_NONE);   /* kept on f32 activations */
    /* slabs: whole rows of scratch, at least one; the output matrix of a 128k vocabulary in 32 slabs */
    CHECK(cuda_gemm_slab_rows(4096, CUDA_GEMM_SCRATCH_HALFS) == 4096);
    CHECK((128256 + 4095) / cuda_gemm_slab_rows(4096, CUDA_GEMM_SCRATCH_HALFS) == 32);
    CHECK(cuda_gemm_slab_rows(14336, CUDA_GEMM_SCRATCH_HALFS) == 1170);
    CHECK(cuda_gemm_slab_rows(0, 100) == 0 && cuda_gemm_slab_rows(101, 100) == 0 && cuda_gemm_slab_rows(100, 100) == 1);
}

int main(void) {
    test_graph_sizes();
    test_step_layout();
    test_attn();
    test_attn_partitions();
    test_attn_walk();
    test_prefill_rules();
    test_q8_ops();
    test_q8_codes();
    test_mem_plan();
    return check_report("test_cuda_plan");
}
