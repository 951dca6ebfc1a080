/* test_backend_amx.c — the integer matmul's AMX-INT8 kernel (matmul_q8_amx_kern.h):
 *  1. the tile emulator (amx_emu.c) against a naive triple loop: tdpbssd and
 *     tdpbsud on random shapes and bytes, int32 wrap-around, the zeroing of
 *     rows and bytes outside the shape, tileloadd / tilestored touching only
 *     rows × colsb, and the faults (bad config, unconfigured tile, shapes
 *     that do not fit, repeated registers) — so the emulator can be trusted
 *     as a stand-in for the hardware (and, where the CPU has AMX-INT8, the
 *     real tiles against the emulator on the same products);
 *  2. the kernel on emulated tiles (qmm_group_amx_emu), on any CPU with the
 *     AVX-512 set (its float step is AVX-512), bit for bit (memcmp) against
 *     the scalar reference (qmm_group_scalar where its buffer takes the
 *     row, else the same unpack + qmm_ref_dot_act it does) for all six
 *     types, n = 1 .. 40 tokens (and 64, 65, 80: the kernel's token chunks), row counts with nr < 16 tails, K up to
 *     5632, weights in rows (packed on the fly) and packed, 1 or 2 threads;
 *  3. the same on the real tiles (qmm_group_amx) where the CPU has AMX-TILE
 *     and AMX-INT8, the OS enables tile state and Linux grants the
 *     permission; and cpu_kernels "amx" is refused, naming what is missing,
 *     where not.
 * Each part the machine cannot run prints SKIP naming the capability. */
#include "check.h"
#include "num_util.h"

#include "backend/backend.h"
#include "backend/cpu/amx_tile.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/qmm.h"
#include "be_util.h"
#include "core/core.h"

#include <string.h>

#define MAX_K 5632
#define MAX_N 80   /* 1 .. 40 each, then past the kernel's 64-token chunk */

static struct rng g_rng;

static float urand(void) { return tu_urand(&g_rng); }
static int irand(int n) { return (int)(rng_u64(&g_rng) % (uint64_t)n); }

/* ---- 1. the emulator ---- */

static struct amx_cfg cfg3(int M, int N, int K4) {   /* C tile 0 (M × N dwords), A 1 (M × 4 K4 bytes), B 2 */
    struct amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = (uint8_t)M;
    c.colsb[0] = (uint16_t)(4 * N);
    c.rows[1] = (uint8_t)M;
    c.colsb[1] = (uint16_t)(4 * K4);
    c.rows[2] = (uint8_t)K4;
    c.colsb[2] = (uint16_t)(4 * N);
    return c;
}

/* hw: also run each product on the real tiles and hold them to the emulator */
static void test_emulator(bool hw) {
    struct amx_emu e;
    int cases = 0, hw_bad = 0;
    for (int it = 0; it < 300; it++) {
        const int M = 1 + irand(16), N = 1 + irand(16), K4 = 1 + irand(16), bu = it % 2;
        struct amx_cfg c = cfg3(M, N, K4);
        CHECK(amx_emu_config(&e, &c) == 0);
        /* memory images wider than the tiles, with sentinels past colsb */
        uint8_t a[16][80], b[16][80];
        int32_t c0[16][20];
        for (int r = 0; r < 16; r++) {
            for (int i = 0; i < 80; i++) a[r][i] = (uint8_t)rng_u64(&g_rng), b[r][i] = (uint8_t)rng_u64(&g_rng);
            for (int i = 0; i < 20; i++)   /* near the int32 limits now and then: the sums wrap */
                c0[r][i] = it % 5 == 0 ? (int32_t)(INT32_MAX - irand(1000)) : (int32_t)(rng_u64(&g_rng) >> 40) - (1 << 23);
        }
        CHECK(amx_emu_load(&e, 1, a, sizeof a[0]) == 0);
        CHECK(amx_emu_load(&e, 2, b, sizeof b[0]) == 0);
        CHECK(amx_emu_load(&e, 0, c0, sizeof c0[0]) == 0);
        /* loads: rows × colsb copied, the rest of the tile zero */
        int bad = 0;
        for (int r = 0; r < 16; r++)
            for (int i = 0; i < 64; i++) {
                bad += e.t[1][r][i] != (r < M && i < 4 * K4 ? a[r][i] : 0);
                bad += e.t[2][r][i] != (r < K4 && i < 4 * N ? b[r][i] : 0);
            }
        CHECK_MSG(!bad, "tileloadd M=%d N=%d K4=%d: %d bytes wrong", M, N, K4, bad);
        CHECK((bu ? amx_emu_dpbsud(&e, 0, 1, 2) : amx_emu_dpbssd(&e, 0, 1, 2)) == 0);
        int32_t out[16][20];
        memset(out, 0x5a, sizeof out);
        CHECK(amx_emu_store(&e, 0, out, sizeof out[0]) == 0);
        if (hw) {
            int32_t hw_out[16][20];
            memcpy(hw_out, c0, sizeof hw_out);
            amx_hw_product(&c, bu, a, sizeof a[0], b, sizeof b[0], hw_out, sizeof hw_out[0]);
            /* stored: rows < M, bytes < 4N; the rest still c0's */
            for (int m = 0; m < 16; m++)
                for (int n = 0; n < 20; n++)
                    hw_bad += hw_out[m][n] != (m < M && n < N ? out[m][n] : c0[m][n]);
        }
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 20; n++) {
                int32_t want = 0x5a5a5a5a;   /* untouched outside M × N */
                if (m < M && n < N) {
                    int64_t s = c0[m][n];
                    for (int k = 0; k < 4 * K4; k++) {
                        const int bv = bu ? (int)b[k / 4][4 * n + k % 4] : (int)(int8_t)b[k / 4][4 * n + k % 4];
                        s += (int64_t)(int8_t)a[m][k] * bv;
                    }
                    want = (int32_t)(uint32_t)(uint64_t)s;   /* mod 2^32 */
                }
                bad += out[m][n] != want;
            }
        for (int r = 0; r < 16; r++)   /* C outside M rows × 4N bytes is zero in the register */
            for (int i = 0; i < 64; i++)
                if (r >= M || i >= 4 * N) bad += e.t[0][r][i] != 0;
        CHECK_MSG(!bad, "tdpbs%cd M=%d N=%d K4=%d: %d values differ from the triple loop", bu ? 'u' : 's', M, N, K4, bad);
        CHECK(amx_emu_zero(&e, 0) == 0);
        uint8_t zero[16][64] = { { 0 } };
        CHECK(memcmp(e.t[0], zero, sizeof zero) == 0);
        cases++;
    }
    /* the faults */
    struct amx_cfg c = cfg3(4, 4, 4);
    CHECK(amx_emu_config(&e, &c) == 0);
    CHECK(amx_emu_dpbssd(&e, 0, 1, 1) == -1 && amx_emu_dpbssd(&e, 0, 0, 2) == -1);   /* repeated registers */
    CHECK(amx_emu_dpbssd(&e, 3, 1, 2) == -1 && amx_emu_load(&e, 3, &c, 1) == -1);     /* tile 3 unconfigured */
    c = cfg3(4, 4, 4);
    c.rows[1] = 5;   /* a.rows != c.rows */
    CHECK(amx_emu_config(&e, &c) == 0 && amx_emu_dpbsud(&e, 0, 1, 2) == -1);
    c = cfg3(4, 4, 4);
    c.rows[2] = 3;   /* a's K != b.rows */
    CHECK(amx_emu_config(&e, &c) == 0 && amx_emu_dpbsud(&e, 0, 1, 2) == -1);
    c = cfg3(4, 4, 4);
    c.colsb[2] = 12;   /* b's N != c's */
    CHECK(amx_emu_config(&e, &c) == 0 && amx_emu_dpbsud(&e, 0, 1, 2) == -1);
    c = cfg3(4, 4, 4);
    c.colsb[1] = 14;   /* not dwords */
    CHECK(amx_emu_config(&e, &c) == 0 && amx_emu_dpbsud(&e, 0, 1, 2) == -1);
    c = cfg3(4, 4, 4);
    c.palette = 2;
    CHECK(amx_emu_config(&e, &c) == -1);
    c = cfg3(4, 4, 4);
    c.reserved[3] = 1;
    CHECK(amx_emu_config(&e, &c) == -1);
    c = cfg3(4, 4, 4);
    c.rows[9] = 1;   /* only 8 tiles */
    c.colsb[9] = 4;
    CHECK(amx_emu_config(&e, &c) == -1);
    c = cfg3(4, 4, 4);
    c.rows[0] = 17;
    CHECK(amx_emu_config(&e, &c) == -1);
    amx_emu_release(&e);
    CHECK(amx_emu_zero(&e, 0) == -1);   /* released: nothing configured */
    printf("AMX emulator: %d random tile products equal the triple loop; faults where the SDM has them\n", cases);
    if (hw) {
        CHECK_MSG(!hw_bad, "the real tiles differ from the emulator in %d values", hw_bad);
        printf("AMX-INT8 tiles: the same %d products equal the emulator's\n", cases);
    }
}

/* ---- 2, 3. the kernel ---- */

/* tb_weight's (be_util.h) with this test's generator. */
static struct tensor make_weight(uint32_t type, int64_t K, int64_t M) { return tb_weight(&g_rng, type, K, M, true); }

/* The scalar reference on all MAX_N tokens: qmm_group_scalar, group by
 * group, where its row buffer (K <= 5120 of Q8_0) takes the rows; else the
 * same arithmetic it does (each row unpacked, qmm_ref_dot_act) here. */
static void reference(const struct tensor *pw, const uint8_t *act, size_t astride, int n, float *y) {
    const int64_t M = pw->ne1, K = pw->ne0;
    const size_t grp = qmm_group_bytes(pw->type, K);
    const bool scalar_fits = pw->row_bytes <= (4096 + 1024) / 32 * sizeof(struct block_q8_0);
    uint8_t *row = malloc(pw->row_bytes);
    KV_ASSERT(row);
    for (int64_t r0 = 0; r0 < M; r0 += QMM_IL) {
        const int nr = (int)(M - r0 < QMM_IL ? M - r0 : QMM_IL);
        const struct qmm_job j = { y, (size_t)M, pw->type, K, act, astride, n };
        if (scalar_fits) {
            qmm_group_scalar(&j, (const uint8_t *)pw->data + (size_t)(r0 / QMM_IL) * grp, r0, nr);
            continue;
        }
        for (int i = 0; i < nr; i++) {
            qmm_unpack_row(pw, r0 + i, row);
            for (int t = 0; t < n; t++)
                y[(size_t)t * (size_t)M + (size_t)(r0 + i)] = qmm_ref_dot_act(pw->type, row, act + (size_t)t * astride, K);
        }
    }
    free(row);
}

struct kset { const char *name; qmm_group_fn *fn; };

/* Every type, K and row count against the reference, n = 1 .. MAX_N
 * (every n to 40 for the smaller K; 1, 2, 15, 16, 17, 33, 40 for the
 * largest; 64, 65, 80 for all). */
static void test_kernel(struct backend_ctx *ctx[2], struct kset ks) {
    static const uint32_t types[] = { DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_IQ4_NL,
                                      DTYPE_MXFP4, DTYPE_Q2_K, DTYPE_Q3_K, DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K,
                                      DTYPE_IQ4_XS };
    static const int64_t Ks[] = { 256, 768, MAX_K };
    static const int64_t Ms[] = { 5, 16, 37 };
    static const int few_n[] = { 1, 2, 15, 16, 17, 33, 40, 64, 65, 80 };
    int cases = 0, differ = 0;
    for (size_t it = 0; it < sizeof types / sizeof *types; it++)
        for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++)
            for (size_t im = 0; im < sizeof Ms / sizeof *Ms; im++) {
                const int64_t K = Ks[ik], M = Ms[im];
                if (K == MAX_K && M != 37) continue;   /* the long rows once, with a tail group */
                const uint32_t type = types[it];
                struct tensor w = make_weight(type, K, M);
                struct tensor pw = w;
                uint8_t *packed = aligned_alloc(64, (qmm_packed_bytes(&w) + 63) & ~(size_t)63);
                KV_ASSERT(packed);
                qmm_pack(&w, packed);
                pw.data = packed;
                pw.layout = TENSOR_Q8X16;
                float *x = malloc((size_t)MAX_N * (size_t)K * sizeof *x);
                const size_t astride = qmm_act_row_bytes(K);
                uint8_t *act = aligned_alloc(64, (size_t)MAX_N * astride);
                float *ref = malloc((size_t)MAX_N * (size_t)M * sizeof *ref);
                float *out = malloc((size_t)MAX_N * (size_t)M * sizeof *out);
                KV_ASSERT(x && act && ref && out);
                for (int64_t i = 0; i < (int64_t)MAX_N * K; i++) x[i] = urand() * (i % 7 == 0 ? 10.0f : 1.0f);
                for (int64_t k = 0; k < 256; k++) x[3 * K + k] = 0;   /* all-zero blocks: dx = 0 */
                for (int t = 0; t < MAX_N; t++) qmm_quantize_act(type, x + (size_t)t * (size_t)K, K, act + (size_t)t * astride);
                reference(&pw, act, astride, MAX_N, ref);
                int bad_n = 0, first_bad = 0;
                for (int n = 1; n <= MAX_N; n++) {
                    bool want = K < MAX_K && n <= 40;
                    for (size_t f = 0; f < sizeof few_n / sizeof *few_n; f++) want |= few_n[f] == n;
                    if (!want) continue;
                    const int th = n % 2, rows_layout = (n / 2) % 2;
                    memset(out, 0xff, (size_t)n * (size_t)M * sizeof *out);
                    CHECK(qmm_matmul(ctx[th], out, rows_layout ? &w : &pw, x, n, ks.fn) == 0);
                    if (memcmp(out, ref, (size_t)n * (size_t)M * sizeof *out) != 0 && !bad_n++) first_bad = n;
                    cases++;
                }
                differ += bad_n > 0;
                CHECK_MSG(!bad_n, "%s %s K=%lld M=%lld: %d token counts differ from the scalar reference (first n=%d)",
                          ks.name, dtype_name(type), (long long)K, (long long)M, bad_n, first_bad);
                free(x);
                free(act);
                free(ref);
                free(out);
                free(packed);
                free((void *)w.data);
            }
    printf("%s: %d cases (type, K, rows, n) against the scalar reference, %d (type, K, rows) with any n differing\n",
           ks.name, cases, differ);
}

/* cpu_kernels "amx": a backend named amx where everything it needs is here,
 * else KVLLM_ECPU. */
static void test_kind(bool amx_ok) {
    struct backend *be = NULL;
    if (!amx_ok) fprintf(stderr, "(the next error is expected)\n");
    const int rc = backend_cpu_new("amx", false, BACKEND_ACT_Q8, &be);
    if (amx_ok) CHECK(rc == 0 && be && strcmp(be->ops->name, "amx") == 0);
    else CHECK(rc == KVLLM_ECPU && be == NULL);
    backend_free(be);
}

int main(void) {
    rng_seed(&g_rng, 20261202);
    struct cpu_features f;
    cpu_features_get(&f);
    const bool avx512 = cpu_avx2_built() && cpu_q8_avx512_built() && f.avx2 && f.fma && f.f16c && f.avx512f &&
                        f.avx512bw && f.avx512vl && f.avx512vnni;
    const bool amx_hw = f.amx_tile && f.amx_int8 && f.amx_os;
    const bool amx_ok = avx512 && cpu_q8_amx_built() && amx_hw && cpu_amx_permit() == 0;
    /* the real tiles need no AVX-512 of their own, only the build (which the avx512 flags gate) */
    test_emulator(cpu_q8_amx_built() && amx_hw && cpu_amx_permit() == 0);
    test_kind(amx_ok);
    if (!avx512) {
        printf("SKIP: the AMX kernel, emulated and real (this CPU or build lacks AVX-512 F/BW/VL/VNNI, "
               "which its float step uses)\n");
        return check_report("test_backend_amx");
    }
    struct backend_ctx *ctx[2] = { tb_new("avx512", false, BACKEND_ACT_Q8, 1, MAX_K, MAX_N, 1, 1, 1),
                                   tb_new("avx512", false, BACKEND_ACT_Q8, 2, MAX_K, MAX_N, 1, 1, 1) };
    CHECK(ctx[0] && ctx[1]);
    if (ctx[0] && ctx[1]) {
        if (cpu_q8_amx_emu_built()) test_kernel(ctx, (struct kset){ "AMX kernel on emulated tiles", qmm_group_amx_emu });
        else CHECK_MSG(0, "the emulated AMX kernel is not built though the AVX-512 one is");
        if (amx_ok) test_kernel(ctx, (struct kset){ "AMX kernel on AMX-INT8 tiles", qmm_group_amx });
        else if (!amx_hw)
            printf("SKIP: the AMX kernel on real tiles: no AMX-INT8 on this CPU (AMX-TILE %s, AMX-INT8 %s, "
                   "OS tile state %s)\n", f.amx_tile ? "yes" : "no", f.amx_int8 ? "yes" : "no", f.amx_os ? "yes" : "no");
        else if (!cpu_q8_amx_built())
            printf("SKIP: the AMX kernel on real tiles: this build's compiler lacks -mamx-tile -mamx-int8\n");
        else
            printf("SKIP: the AMX kernel on real tiles: Linux refused this process AMX tile data (%s)\n",
                   strerror(cpu_amx_permit()));
    }
    tb_free(ctx[0]);
    tb_free(ctx[1]);
    return check_report("test_backend_amx");
}
