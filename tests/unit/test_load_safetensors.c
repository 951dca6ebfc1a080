/* test_load_safetensors.c — the safetensors header writer and reader against
 * each other, every rule of the validator on a hand-made header, and a small
 * fuzz: every truncation and random byte corruption of a valid image is
 * parsed or refused (one error line) without a crash.  Run under ASan in the
 * sanitizer build. */
#include "check.h"
#include "io_util.h"
#include "load/safetensors.h"
#include "tensor/dtype.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* A valid image from the writer: three tensors, F32 (2x3), F16 (5), BF16 (2x2). */
static size_t build(uint8_t *buf, size_t cap) {
    struct st_write_entry e[3] = {
        { "a.weight", DTYPE_F32, 2, { 2, 3 } },
        { "b", DTYPE_F16, 1, { 5 } },
        { "c", DTYPE_BF16, 2, { 2, 2 } },
    };
    FILE *f = tmpfile();
    CHECK(f != NULL);
    CHECK(st_write_header(f, "mem", e, 3) == 0);
    float a[6] = { 1, 2, 3, 4, 5, 6 };
    uint16_t b[5], c[4];
    for (int i = 0; i < 5; i++) b[i] = f32_to_f16((float)i);
    for (int i = 0; i < 4; i++) c[i] = f32_to_bf16((float)-i);
    fwrite(a, 1, sizeof a, f);
    fwrite(b, 1, sizeof b, f);
    fwrite(c, 1, sizeof c, f);
    long n = ftell(f);
    rewind(f);
    CHECK(n > 0 && (size_t)n <= cap);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    CHECK(got == (size_t)n);
    return got;
}

/* An image from a JSON header (padded) and n data bytes of zeros. */
static size_t image(uint8_t *buf, const char *json, size_t n_data) {
    size_t h = strlen(json), pad = (8 - h % 8) % 8;
    uint64_t hl = h + pad;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(hl >> (8 * i));
    memcpy(buf + 8, json, h);
    memset(buf + 8 + h, ' ', pad);
    memset(buf + 8 + hl, 0, n_data);
    return 8 + hl + n_data;
}

/* Parse json + n_data bytes; expect rc; when failing, one error naming "want". */
static void expect(const char *json, size_t n_data, int want_rc, const char *want) {
    static uint8_t buf[4096];
    size_t n = image(buf, json, n_data);
    struct st_file sf;
    tu_log_reset();
    int rc = st_parse("case.safetensors", buf, n, &sf);
    CHECK_MSG(rc == want_rc, "%s: rc %d, want %d (%s)", json, rc, want_rc, tu_log.last_error);
    if (want_rc) {
        CHECK_MSG(tu_log.n_errors == 1, "%s: %d error lines", json, tu_log.n_errors);
        const char *msg = tu_log.last_error;
        CHECK_MSG(strstr(msg, "case.safetensors") && (!want || strstr(msg, want)), "%s: message '%s'", json, msg);
        CHECK(sf.n_tensors == 0 && sf.tensors == NULL);
    }
    st_file_deinit(&sf);
}

int main(void) {
    kvllm_log_set(tu_log_capture, NULL);
    static uint8_t img[4096];
    size_t n = build(img, sizeof img);

    /* round trip */
    struct st_file sf;
    CHECK(st_parse("mem", img, n, &sf) == 0);
    CHECK(sf.n_tensors == 3);
    if (sf.n_tensors == 3) {
        CHECK(!strcmp(sf.tensors[0].name, "a.weight") && sf.tensors[0].dtype == DTYPE_F32);
        CHECK(sf.tensors[0].n_dims == 2 && sf.tensors[0].shape[0] == 2 && sf.tensors[0].shape[1] == 3);
        CHECK(sf.tensors[0].n_bytes == 24 && ((uintptr_t)(sf.tensors[0].data - img) - 8) % 8 == 0);
        float a5;
        memcpy(&a5, sf.tensors[0].data + 20, 4);
        CHECK(a5 == 6.0f);
        CHECK(!strcmp(sf.tensors[1].name, "b") && sf.tensors[1].dtype == DTYPE_F16 && sf.tensors[1].n_elems == 5);
        uint16_t b4;
        memcpy(&b4, sf.tensors[1].data + 8, 2);
        CHECK(f16_to_f32(b4) == 4.0f);
        CHECK(!strcmp(sf.tensors[2].name, "c") && sf.tensors[2].dtype == DTYPE_BF16 && sf.tensors[2].n_bytes == 8);
        CHECK(sf.tensors[2].data + 8 == img + n);
    }
    st_file_deinit(&sf);
    st_file_deinit(NULL);

    /* the rules, one by one */
    expect("{}", 0, 0, NULL);
    expect("{\"__metadata__\":{\"x\":\"y\"},\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, NULL);
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, 0, NULL); /* scalar */
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, KVLLM_EFORMAT, "ends early");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 8, KVLLM_EFORMAT, "trailing");
    expect("[1]", 0, KVLLM_EFORMAT, "not a JSON object");
    expect("{\"t\":3}", 0, KVLLM_EFORMAT, "'t'");
    expect("{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KVLLM_EFORMAT, "dtype");
    expect("{\"t\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, KVLLM_EUNSUPPORTED, "I64");
    expect("{\"t\":{\"dtype\":\"X9\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8, KVLLM_EFORMAT, "unknown dtype");
    expect("{\"t\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, KVLLM_EFORMAT, "needs 4 bytes");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, KVLLM_EFORMAT, "needs 12 bytes");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, KVLLM_EFORMAT, "dimensions");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, KVLLM_EFORMAT, "shape[0]");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, KVLLM_EFORMAT, "shape[0]");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, KVLLM_EFORMAT,
           "overflow");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,4]}}", 4, KVLLM_EFORMAT,
           "overflow");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, KVLLM_EFORMAT, "out of range");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[18446744073709551615,7]}}", 8, KVLLM_EFORMAT,
           "t");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, KVLLM_EFORMAT, "end before");
    expect("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, KVLLM_EFORMAT, "data_offsets");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, KVLLM_EFORMAT, "overlap");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8, KVLLM_EFORMAT, "overlap");
    expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, 0, NULL); /* empty: no bytes */

    /* header length past the end, and absurd */
    {
        uint8_t b[16] = { 0 };
        b[0] = 9;
        tu_log_reset();
        CHECK(st_parse("len.safetensors", b, sizeof b, &sf) == KVLLM_EFORMAT && tu_log.n_errors == 1);
        CHECK(strstr(tu_log.last_error, "runs past the end") != NULL);
        memset(b, 0xff, 8);
        CHECK(st_parse("len.safetensors", b, sizeof b, &sf) == KVLLM_EFORMAT);
        CHECK(st_parse("len.safetensors", b, 7, &sf) == KVLLM_EFORMAT);
        CHECK(st_parse("len.safetensors", NULL, 0, &sf) == KVLLM_EFORMAT);
    }

    /* every truncation of the valid image is refused, with one error line */
    int bad = 0;
    for (size_t cut = 0; cut < n; cut++) {
        tu_log_reset();
        int rc = st_parse("mem.cut", img, cut, &sf);
        if (rc == 0 || tu_log.n_errors != 1) bad++;
        st_file_deinit(&sf);
    }
    CHECK_MSG(bad == 0, "%d truncations accepted or not reported once", bad);

    /* random corruption: parsed or refused, never a crash; what parses stays inside the image */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    static uint8_t cp[4096];
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(cp, img, n);
        int k = 1 + (int)(s % 4);
        for (int j = 0; j < k; j++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            size_t pos = (size_t)(s % n);
            cp[pos] = (uint8_t)(s >> 32);
        }
        tu_log_reset();
        int rc = st_parse("mem.fuzz", cp, n, &sf);
        if (rc == 0) {
            accepted++;
            for (uint64_t i = 0; i < sf.n_tensors; i++)
                CHECK(sf.tensors[i].data >= cp + 8 && sf.tensors[i].data + sf.tensors[i].n_bytes <= cp + n);
        } else {
            CHECK(tu_log.n_errors == 1);
        }
        st_file_deinit(&sf);
    }
    printf("fuzz: %d of 20000 corrupted images still parse (data bytes hit)\n", accepted);
    return check_report("test_load_safetensors");
}
