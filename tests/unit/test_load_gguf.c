/* test_load_gguf.c — the GGUF builder, writer and reader against each other:
 * every metadata type survives a round trip; every truncation of a valid
 * file and random byte corruption is rejected (or read) without a crash. */
#include "check.h"
#include "io_util.h"
#include "load/gguf.h"
#include "tensor/dtype.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static char g_path[64];

static struct gguf *build(float *w, uint16_t *h) {
    struct gguf *g = gguf_new("test");
    CHECK(g != NULL);
    CHECK(gguf_set_str(g, "general.architecture", "llama") == 0);
    CHECK(gguf_set_u32(g, "a.u32", 4000000000u) == 0);
    CHECK(gguf_set_i32(g, "a.i32", -7) == 0);
    CHECK(gguf_set_f32(g, "a.f32", 0.5f) == 0);
    CHECK(gguf_set_bool(g, "a.bool", true) == 0);
    int32_t ai[3] = { 1, -2, 3 };
    float af[2] = { 1.5f, -2.5f };
    CHECK(gguf_set_arr(g, "a.arr_i32", GGUF_T_INT32, ai, 3) == 0);
    CHECK(gguf_set_arr(g, "a.arr_f32", GGUF_T_FLOAT32, af, 2) == 0);
    struct gguf_str ss[3] = { { "x", 1 }, { "", 0 }, { "h\xc3\xa9llo", 6 } };
    CHECK(gguf_set_arr_str(g, "a.arr_str", ss, 3) == 0);
    CHECK(gguf_set_u32(g, "a.u32", 4000000001u) == 0); /* replaces, does not duplicate */
    for (int i = 0; i < 64 * 3; i++) w[i] = (float)i * 0.25f;
    for (int i = 0; i < 64; i++) h[i] = f32_to_f16((float)i);
    CHECK(gguf_add_tensor(g, "w", DTYPE_F32, 2, (int64_t[]){ 64, 3 }, w) == 0);
    CHECK(gguf_add_tensor(g, "h", DTYPE_F16, 1, (int64_t[]){ 64 }, h) == 0);
    CHECK(gguf_add_tensor(g, "bad", DTYPE_Q8_0, 1, (int64_t[]){ 33 }, h) != 0); /* not whole blocks */
    return g;
}

static void test_round_trip(void) {
    float w[64 * 3];
    uint16_t h[64];
    struct gguf *g = build(w, h);
    CHECK(g->n_kv == 8 && g->n_tensors == 2);
    CHECK(gguf_write(g, g_path) == 0);
    gguf_free(g);

    struct gguf *r = NULL;
    CHECK(gguf_open(g_path, &r) == 0);
    if (!r) return;
    uint32_t u;
    float f;
    bool b;
    struct gguf_str s;
    CHECK(r->version == 3 && r->n_kv == 8 && r->n_tensors == 2);
    CHECK(gguf_get_u32(r, "a.u32", &u) == 0 && u == 4000000001u);
    CHECK(gguf_get_u32(r, "a.i32", &u) == KVLLM_EFORMAT); /* negative does not fit */
    CHECK(gguf_get_f32(r, "a.f32", &f) == 0 && f == 0.5f);
    CHECK(gguf_get_bool(r, "a.bool", &b) == 0 && b);
    CHECK(gguf_get_str(r, "general.architecture", &s) == 0 && gguf_str_eq(s, "llama"));
    CHECK(gguf_get_str(r, "missing", &s) == KVLLM_ENOTFOUND);
    const struct gguf_kv *kv;
    CHECK(gguf_get_arr(r, "a.arr_i32", GGUF_T_INT32, &kv) == 0 && kv->v.arr.n == 3 && gguf_arr_i64(kv, 1) == -2);
    CHECK(gguf_get_arr(r, "a.arr_f32", GGUF_T_FLOAT32, &kv) == 0 && gguf_arr_f64(kv, 1) == -2.5);
    CHECK(gguf_get_arr(r, "a.arr_f32", GGUF_T_INT32, &kv) == KVLLM_EFORMAT);
    CHECK(gguf_get_arr(r, "a.arr_str", GGUF_T_STRING, &kv) == 0 && kv->v.arr.n == 3 &&
          gguf_str_eq(kv->v.arr.strs[2], "h\xc3\xa9llo") && kv->v.arr.strs[1].len == 0);
    const struct gguf_tensor *t = gguf_find_tensor(r, "w");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 3 && t->type == DTYPE_F32 && t->n_bytes == sizeof w);
    CHECK(t && !memcmp(t->data, w, sizeof w));
    CHECK(t && ((uintptr_t)t->data - (uintptr_t)r->map.data) % 32 == 0);
    t = gguf_find_tensor(r, "h");
    CHECK(t && t->n_dims == 1 && !memcmp(t->data, h, sizeof h));
    gguf_free(r);
}

/* Every strict prefix of the file must be rejected cleanly. */
static void test_truncations(void) {
    FILE *f = fopen(g_path, "rb");
    static uint8_t buf[8192];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    CHECK(n > 100 && n < sizeof buf);
    char tpath[96];
    snprintf(tpath, sizeof tpath, "%s.cut", g_path);
    int accepted = 0;
    for (size_t len = 0; len < n; len++) {
        f = fopen(tpath, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        struct gguf *r = NULL;
        int rc = gguf_open(tpath, &r);
        /* padding after the last tensor's data may be cut without losing data */
        if (rc == 0) { accepted++; gguf_free(r); } else CHECK(r == NULL);
    }
    CHECK_MSG(accepted == 0, "%d truncated files accepted", accepted);

    /* random single-byte corruptions: either a clean error or a readable file */
    unsigned s = 1;
    for (int i = 0; i < 3000; i++) {
        uint8_t c[8192];
        memcpy(c, buf, n);
        s = s * 1103515245u + 12345u;
        size_t at = (s >> 8) % n;
        c[at] ^= (uint8_t)(1u << ((s >> 4) % 8));
        f = fopen(tpath, "wb");
        fwrite(c, 1, n, f);
        fclose(f);
        struct gguf *r = NULL;
        if (gguf_open(tpath, &r) == 0) {
            for (uint64_t k = 0; k < r->n_tensors; k++) {
                const struct gguf_tensor *t = &r->tensors[k];
                CHECK((const uint8_t *)t->data + t->n_bytes <= r->map.data + r->map.size);
            }
            gguf_free(r);
        }
    }
    unlink(tpath);
}

int main(void) {
    snprintf(g_path, sizeof g_path, "/tmp/kvllm_test_gguf_%d.gguf", (int)getpid());
    test_round_trip();
    /* the truncation loop logs thousands of (expected) errors: count them instead */
    kvllm_log_set(tu_log_capture, NULL);
    test_truncations();
    CHECK(tu_log.n_errors > 1000);
    CHECK_MSG(strstr(tu_log.last_error, ".cut: ") != NULL, "last error: %s", tu_log.last_error);
    unlink(g_path);
    return check_report("test_load_gguf");
}
