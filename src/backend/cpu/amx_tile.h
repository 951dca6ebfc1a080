/* amx_tile.h — the AMX tile operations the integer matmul's AMX kernel uses
 * (matmul_q8_amx_kern.h), and a plain-C emulator of them (amx_emu.c) so
 * that kernel's logic runs, and is tested bit for bit, on CPUs without AMX.
 *
 * The model (Intel SDM vol. 2, TILELOADD / TILESTORED / TILEZERO /
 * TDPBSSD / TDPBSUD; palette 1): eight tile registers tmm0..7 of 16 rows of
 * 64 bytes.  LDTILECFG sets each tile's rows (<= 16) and bytes per row colsb
 * (<= 64); a tile with either 0 is unconfigured, and using it faults (#UD).
 *   tileloadd t, [base + stride * r]: rows 0..rows-1 take colsb bytes each
 *     from memory; the rest of each row and every row past rows read 0.
 *   tilestored: rows 0..rows-1, colsb bytes each, to memory.
 *   tilezero: every byte of t is 0.
 *   tdpbssd c, a, b (tdpbsud: a signed, b unsigned bytes): for m < c.rows,
 *     n < c.colsb / 4: c.dword[m][n] += Σ_{k < a.colsb / 4} Σ_{i < 4}
 *     a.byte[m][4k + i] · b.byte[k][4n + i], in int32 (wrapping); the rest of
 *     c zeroed.  Faults unless c, a, b differ, a.rows == c.rows, a.colsb / 4
 *     == b.rows, b.colsb == c.colsb, all colsb multiples of 4.
 * So with A = 16 token rows of K activation codes and B = K / 4 rows of 16
 * columns × 4 consecutive K bytes ("VNNI" layout: exactly TENSOR_Q8X16's
 * runs), C[token][row] is the integer dot product of a token and a weight
 * row over those K codes.
 *
 * The real instructions are written as inline asm in matmul_q8_amx.c, not
 * with GCC's <amxtileintrin.h>: GCC 12's _tile_loadconfig tells the
 * compiler that only 8 bytes are read, so the stores filling the 64-byte
 * config are dropped (the first tile instruction then dies with SIGILL),
 * and its _tile_loadd / _tile_stored name no memory at all, so stores the
 * tile load reads, or loads of what the tile store wrote, could be moved
 * or dropped too.  Each asm here says what it reads and writes. */
#ifndef KVLLM_AMX_TILE_H
#define KVLLM_AMX_TILE_H

#include <stddef.h>
#include <stdint.h>

/* LDTILECFG's 64-byte operand (palette 1) */
struct amx_cfg {
    uint8_t palette;        /* 1; 0 releases the tiles */
    uint8_t start_row;      /* restart point after an interrupt: always 0 here */
    uint8_t reserved[14];   /* must be 0 */
    uint16_t colsb[16];     /* bytes per row of tile i (only 8 exist; the rest must be 0) */
    uint8_t rows[16];
};
_Static_assert(sizeof(struct amx_cfg) == 64, "LDTILECFG reads 64 bytes");

/* The emulator: one state per thread of execution, as the registers are. */
struct amx_emu {
    struct amx_cfg cfg;
    int configured;             /* LDTILECFG with palette 1 done, not released */
    uint8_t t[8][16][64];       /* tmm0..7 */
};

/* Each returns 0, or -1 where the processor would fault (#GP for a bad
 * config, #UD for an unconfigured tile or shapes that do not fit): the
 * emulated kernel asserts 0, and test_backend_amx checks the faults. */
int amx_emu_config(struct amx_emu *e, const struct amx_cfg *c);
void amx_emu_release(struct amx_emu *e);
int amx_emu_zero(struct amx_emu *e, int t);
int amx_emu_load(struct amx_emu *e, int t, const void *base, size_t stride);
int amx_emu_store(struct amx_emu *e, int t, void *base, size_t stride);
int amx_emu_dpbssd(struct amx_emu *e, int c, int a, int b);
int amx_emu_dpbsud(struct amx_emu *e, int c, int a, int b);

/* The real tiles (matmul_q8_amx.c; only where cpu_q8_amx_built() and
 * cpu_amx_permit() == 0): with config cfg, whose tiles 0 (C), 1 (A), 2 (B)
 * must fit one tile product, load C, A and B from memory (rows stride
 * bytes apart), tdpbsud (b_unsigned) or tdpbssd, store C back, release the
 * tiles — so a test can hold the hardware to the emulator. */
void amx_hw_product(const struct amx_cfg *cfg, int b_unsigned, const void *a, size_t as, const void *b, size_t bs,
                    void *c, size_t cs);

#endif
