/* amx_emu.c — the AMX tile emulator (amx_tile.h), following the Intel SDM's
 * pseudo-code for LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TDPBSSD and
 * TDPBSUD (palette 1, start_row always 0 after each instruction).  Plain C
 * and slow; it exists so the AMX kernel's logic is tested on any CPU. */
#include "backend/cpu/amx_tile.h"

#include <string.h>

#define NTILES 8
#define MAX_ROWS 16
#define MAX_COLSB 64

int amx_emu_config(struct amx_emu *e, const struct amx_cfg *c) {
    /* palette 0 is the init state (tiles released); 1 is the only other */
    if (c->palette > 1) return -1;
    for (int i = 0; i < 14; i++)
        if (c->reserved[i]) return -1;
    for (int t = 0; t < 16; t++) {
        if (t >= NTILES && (c->rows[t] || c->colsb[t])) return -1;
        if (c->rows[t] > MAX_ROWS || c->colsb[t] > MAX_COLSB) return -1;
    }
    memset(e, 0, sizeof *e);   /* LDTILECFG zeroes every tile */
    if (c->palette == 0) return 0;
    e->cfg = *c;
    e->cfg.start_row = 0;      /* we never resume a faulted load */
    e->configured = 1;
    return 0;
}

void amx_emu_release(struct amx_emu *e) { memset(e, 0, sizeof *e); }

static int valid(const struct amx_emu *e, int t) {
    return e->configured && t >= 0 && t < NTILES && e->cfg.rows[t] && e->cfg.colsb[t];
}

/* write_row_and_zero / zero_upper_rows of the pseudo-code */
static void set_row(struct amx_emu *e, int t, int r, const uint8_t *data, int nbytes) {
    memcpy(e->t[t][r], data, (size_t)nbytes);
    memset(e->t[t][r] + nbytes, 0, (size_t)(MAX_COLSB - nbytes));
}
static void zero_upper_rows(struct amx_emu *e, int t, int from) {
    for (int r = from; r < MAX_ROWS; r++) memset(e->t[t][r], 0, MAX_COLSB);
}

int amx_emu_zero(struct amx_emu *e, int t) {
    if (!valid(e, t)) return -1;
    memset(e->t[t], 0, sizeof e->t[t]);
    return 0;
}

int amx_emu_load(struct amx_emu *e, int t, const void *base, size_t stride) {
    if (!valid(e, t)) return -1;
    const int rows = e->cfg.rows[t], colsb = e->cfg.colsb[t];
    for (int r = 0; r < rows; r++) set_row(e, t, r, (const uint8_t *)base + (size_t)r * stride, colsb);
    zero_upper_rows(e, t, rows);
    return 0;
}

int amx_emu_store(struct amx_emu *e, int t, void *base, size_t stride) {
    if (!valid(e, t)) return -1;
    const int rows = e->cfg.rows[t], colsb = e->cfg.colsb[t];
    for (int r = 0; r < rows; r++) memcpy((uint8_t *)base + (size_t)r * stride, e->t[t][r], (size_t)colsb);
    return 0;
}

/* TDPBSSD (b_unsigned 0) and TDPBSUD (1): a's bytes signed, b's signed or
 * unsigned; four products per dword pair summed into the int32 (wrapping,
 * as the hardware's 32-bit adds: done in uint32). */
static int dp(struct amx_emu *e, int c, int a, int b, int b_unsigned) {
    if (!valid(e, c) || !valid(e, a) || !valid(e, b) || c == a || c == b || a == b) return -1;
    const struct amx_cfg *g = &e->cfg;
    if (g->colsb[c] % 4 || g->colsb[a] % 4 || g->colsb[b] % 4) return -1;
    if (g->rows[a] != g->rows[c] || g->colsb[a] / 4 != g->rows[b] || g->colsb[b] != g->colsb[c]) return -1;
    const int M = g->rows[c], N = g->colsb[c] / 4, K = g->colsb[a] / 4;
    for (int m = 0; m < M; m++) {
        uint32_t tmp[MAX_COLSB / 4];
        memcpy(tmp, e->t[c][m], sizeof tmp);
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) {
                uint32_t s = 0;
                for (int i = 0; i < 4; i++) {
                    const int32_t x = (int8_t)e->t[a][m][4 * k + i];
                    const int32_t y = b_unsigned ? (int32_t)e->t[b][k][4 * n + i] : (int32_t)(int8_t)e->t[b][k][4 * n + i];
                    s += (uint32_t)(x * y);
                }
                tmp[n] += s;
            }
        set_row(e, c, m, (const uint8_t *)tmp, 4 * N);
    }
    zero_upper_rows(e, c, M);
    return 0;
}

int amx_emu_dpbssd(struct amx_emu *e, int c, int a, int b) { return dp(e, c, a, b, 0); }
int amx_emu_dpbsud(struct amx_emu *e, int c, int a, int b) { return dp(e, c, a, b, 1); }
