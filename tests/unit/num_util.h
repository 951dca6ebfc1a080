/* num_util.h — random test data and the error measure of the numeric unit
 * tests (backend ops, matmul, paged attention, dtypes): one definition of
 * each, so that every test means the same thing by "relative error" and by
 * "normal data".  Each helper draws from the caller's struct rng (core),
 * seeded by the test, so a run is reproducible from its seed. */
#ifndef KVLLM_NUM_UTIL_H
#define KVLLM_NUM_UTIL_H
#include "core/core.h"

#include <math.h>
#include <stddef.h>

/* Uniform in [-1, 1). */
static inline float tu_urand(struct rng *r) { return rng_f32(r) * 2.0f - 1.0f; }

/* Uniform integer in [0, n) (n > 0), and in [lo, hi]. */
static inline int tu_rnd(struct rng *r, int n) { return (int)(rng_u64(r) % (uint64_t)n); }
static inline int tu_rnd_in(struct rng *r, int lo, int hi) { return lo + tu_rnd(r, hi - lo + 1); }

/* Standard normal: Marsaglia's polar method.  The second value of each pair is
 * dropped, so the helper keeps no state besides r. */
static inline float tu_gauss(struct rng *r) {
    float u, v, s;
    do {
        u = tu_urand(r);
        v = tu_urand(r);
        s = u * u + v * v;
    } while (s >= 1 || s == 0);
    return u * sqrtf(-2 * logf(s) / s);
}

/* ‖out − ref‖ / max(‖ref‖, floor) over n elements; the absolute ‖out − ref‖
 * when that is 0; INFINITY when either norm is NaN or Inf, so that any
 * tolerance check fails on a non-finite output.  floor = 0 is the plain
 * relative error; a floor keeps it meaningful where ref is near zero. */
static inline double tu_rel_err_ff(const float *out, const float *ref, size_t n, double floor) {
    double num = 0, den = floor * floor;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)out[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    if (!isfinite(num) || !isfinite(den)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline double tu_rel_err_fd(const float *out, const double *ref, size_t n, double floor) {
    double num = 0, den = floor * floor;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)out[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (!isfinite(num) || !isfinite(den)) return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* rel_err(out, ref, n) and rel_err_floor(out, ref, n, floor): ref is a float
 * or a double array (a reference computed in double is never rounded). */
#define rel_err_floor(out, ref, n, floor) \
    _Generic((ref), float *: tu_rel_err_ff, const float *: tu_rel_err_ff, \
             double *: tu_rel_err_fd, const double *: tu_rel_err_fd)((out), (ref), (size_t)(n), (floor))
#define rel_err(out, ref, n) rel_err_floor((out), (ref), (n), 0.0)
#endif
