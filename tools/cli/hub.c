/* hub.c — downloads from a Hugging Face hub into the huggingface_hub cache (hub.h). */
#include "hub.h"
#include "cli.h"

#include <curl/curl.h>
#include <json-c/json.h>

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef KVLLM_VERSION
#define KVLLM_VERSION "0.0.0"
#endif

/* ---- SHA-256 (FIPS 180-4), to check a finished LFS file against its ETag ---- */

static const uint32_t k_sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

struct sha256 { uint32_t h[8]; uint64_t n; uint8_t buf[64]; };

#define ROR(x, r) (((x) >> (r)) | ((x) << (32 - (r))))

static void sha256_block(struct sha256 *s, const uint8_t *p) {
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(v, s->h, sizeof v);
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = v[7] + (ROR(v[4], 6) ^ ROR(v[4], 11) ^ ROR(v[4], 25)) + ((v[4] & v[5]) ^ (~v[4] & v[6])) + k_sha_k[i] + w[i];
        uint32_t t2 = (ROR(v[0], 2) ^ ROR(v[0], 13) ^ ROR(v[0], 22)) + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof *v);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) s->h[i] += v[i];
}

static void sha256_init(struct sha256 *s) {
    static const uint32_t h0[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memcpy(s->h, h0, sizeof h0);
    s->n = 0;
}

static void sha256_update(struct sha256 *s, const uint8_t *p, size_t n) {
    while (n) {
        size_t at = s->n % 64, take = 64 - at < n ? 64 - at : n;
        memcpy(s->buf + at, p, take);
        s->n += take, p += take, n -= take;
        if (s->n % 64 == 0) sha256_block(s, s->buf);
    }
}

static void sha256_hex(struct sha256 *s, char out[65]) {
    uint64_t bits = s->n * 8;
    uint8_t pad[72] = { 0x80 };
    size_t npad = (s->n % 64 < 56 ? 56 : 120) - s->n % 64;
    for (int i = 0; i < 8; i++) pad[npad + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", s->h[i]);
}

/* The file's SHA-256 in hex; false on a read error (printed). */
static bool sha256_file(const char *path, char out[65]) {
    FILE *f = fopen(path, "rb");
    if (!f) { cli_error("%s: cannot open: %s", path, strerror(errno)); return false; }
    struct sha256 s;
    sha256_init(&s);
    static uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sha256_update(&s, buf, n);
    bool ok = !ferror(f);
    fclose(f);
    if (!ok) { cli_error("%s: read error", path); return false; }
    sha256_hex(&s, out);
    return true;
}

/* ---- where things are ---- */

struct hub {
    char endpoint[512];   /* no trailing '/' */
    char repo_dir[2048];  /* $HF_HUB_CACHE/models--owner--name */
    char repo[256];       /* owner/name */
    const char *token;
    bool offline;
    CURL *curl;
};

static bool exists(const char *p) { struct stat st; return !stat(p, &st); }

/* mkdir -p of path's folders (and of path itself when whole). */
static bool make_dirs(const char *path, bool whole) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) { cli_error("%s: cannot create: %s", buf, strerror(errno)); return false; }
        *p = '/';
    }
    if (whole && mkdir(buf, 0755) && errno != EEXIST) { cli_error("%s: cannot create: %s", buf, strerror(errno)); return false; }
    return true;
}

bool hub_is_repo_name(const char *s) {
    if (!s || exists(s)) return false;
    const char *slash = strchr(s, '/'), *colon = strchr(s, ':');
    if (!slash || slash == s || strchr(slash + 1, '/') || (colon && colon < slash)) return false;
    size_t n = colon ? (size_t)(colon - s) : strlen(s);
    if (slash + 1 == s + n) return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("/-_.", s[i])) return false;
    /* a missing file (models/x.gguf) stays a path, reported as missing, never looked up on the hub */
    static const char *const k_file_ext[] = { ".gguf", ".bin", ".safetensors", ".json", ".model" };
    for (size_t k = 0; k < sizeof k_file_ext / sizeof *k_file_ext; k++) {
        size_t e = strlen(k_file_ext[k]);
        if (n > e && !strncasecmp(s + n - e, k_file_ext[k], e)) return false;
    }
    return s[0] != '.' && !strstr(s, "..");
}

static void hub_paths(struct hub *h, const char *token) {
    const char *ep = getenv("HF_ENDPOINT");
    snprintf(h->endpoint, sizeof h->endpoint, "%s", ep && *ep ? ep : "https://huggingface.co");
    size_t n = strlen(h->endpoint);
    while (n && h->endpoint[n - 1] == '/') h->endpoint[--n] = 0;
    char cache[1024];
    const char *c = getenv("HF_HUB_CACHE"), *home = getenv("HF_HOME"), *xdg = getenv("XDG_CACHE_HOME");
    if (c && *c) snprintf(cache, sizeof cache, "%s", c);
    else if (home && *home) snprintf(cache, sizeof cache, "%s/hub", home);
    else if (xdg && *xdg) snprintf(cache, sizeof cache, "%s/huggingface/hub", xdg);
    else snprintf(cache, sizeof cache, "%s/.cache/huggingface/hub", getenv("HOME") ? getenv("HOME") : ".");
    char folder[300] = "models--";
    for (size_t i = 0, o = 8; h->repo[i] && o + 3 < sizeof folder; i++) {
        if (h->repo[i] == '/') { folder[o++] = '-'; folder[o++] = '-'; }
        else folder[o++] = h->repo[i];
        folder[o] = 0;
    }
    snprintf(h->repo_dir, sizeof h->repo_dir, "%s/%s", cache, folder);
    const char *t = token ? token : getenv("HF_TOKEN");
    h->token = t && *t ? t : NULL;
    const char *off = getenv("HF_HUB_OFFLINE");
    h->offline = off && *off && strcmp(off, "0") && strcasecmp(off, "false");
}

/* refs/main's commit, or false */
static bool read_ref(const struct hub *h, char *commit, size_t cap) {
    char p[2300];
    snprintf(p, sizeof p, "%s/refs/main", h->repo_dir);
    FILE *f = fopen(p, "r");
    if (!f) return false;
    bool ok = fgets(commit, (int)cap, f) != NULL;
    fclose(f);
    commit[strcspn(commit, "\r\n")] = 0;
    return ok && *commit && !strchr(commit, '/');
}

/* ---- HTTP ---- */

/* What the headers of a resolve answer say (the first answer's, before any redirect, for the ETag and
 * commit: the CDN's own ETag is not the file's hash). */
struct head {
    char commit[128], etag[160];
    long long size, length;
};

static void header_value(const char *line, size_t n, const char *name, char *out, size_t cap, bool first) {
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) || line[k] != ':' || (first && *out)) return;
    const char *v = line + k + 1;
    size_t m = n - k - 1;
    while (m && (*v == ' ' || *v == '\t')) v++, m--;
    while (m && (v[m - 1] == '\r' || v[m - 1] == '\n' || v[m - 1] == ' ')) m--;
    if (m >= 2 && v[0] == 'W' && v[1] == '/') v += 2, m -= 2;
    if (m >= 2 && v[0] == '"' && v[m - 1] == '"') v++, m -= 2;
    if (m >= cap) m = cap - 1;
    memcpy(out, v, m);
    out[m] = 0;
}

static size_t on_header(char *line, size_t size, size_t nitems, void *user) {
    struct head *hd = user;
    size_t n = size * nitems;
    char num[32] = "";
    header_value(line, n, "x-repo-commit", hd->commit, sizeof hd->commit, true);
    header_value(line, n, "x-linked-etag", hd->etag, sizeof hd->etag, true);
    header_value(line, n, "etag", hd->etag, sizeof hd->etag, true);
    header_value(line, n, "x-linked-size", num, sizeof num, false);
    if (*num && hd->size < 0) hd->size = atoll(num);
    *num = 0;
    header_value(line, n, "content-length", num, sizeof num, false);
    if (*num) hd->length = atoll(num);
    return n;
}

static void curl_setup(struct hub *h, const char *url, struct curl_slist **hdrs) {
    curl_easy_reset(h->curl);
    curl_easy_setopt(h->curl, CURLOPT_URL, url);
    curl_easy_setopt(h->curl, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h->curl, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(h->curl, CURLOPT_CONNECTTIMEOUT, 30L);
    /* a stalled transfer (no byte for a minute) fails rather than hangs */
    curl_easy_setopt(h->curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h->curl, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(h->curl, CURLOPT_USERAGENT, "kvllm/" KVLLM_VERSION);
    curl_easy_setopt(h->curl, CURLOPT_NOSIGNAL, 1L);
    *hdrs = NULL;
    if (h->token) {
        char auth[1024];
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", h->token);
        *hdrs = curl_slist_append(NULL, auth);   /* libcurl drops it on a redirect to another host */
        curl_easy_setopt(h->curl, CURLOPT_HTTPHEADER, *hdrs);
    }
}

/* Run the request curl_setup prepared: its status in *status, its headers freed. */
static CURLcode http_perform(struct hub *h, struct curl_slist *hdrs, long *status) {
    CURLcode rc = curl_easy_perform(h->curl);
    *status = 0;
    curl_easy_getinfo(h->curl, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hdrs);
    return rc;
}

/* Why a request failed, for the error line. */
static void http_why(CURLcode rc, long status, char *out, size_t cap) {
    if (rc != CURLE_OK) snprintf(out, cap, "%s", curl_easy_strerror(rc));
    else if (status == 401 || status == 403)
        snprintf(out, cap, "HTTP %ld (a gated or private repository: set HF_TOKEN)", status);
    else if (status == 404) snprintf(out, cap, "HTTP 404 (no such repository or file)");
    else snprintf(out, cap, "HTTP %ld", status);
}

static size_t on_mem(char *p, size_t size, size_t n, void *user) { return fwrite(p, size, n, user) * size; }

/* GET url into a malloc'd NUL-terminated string; NULL with *why set. */
static char *http_get(struct hub *h, const char *url, char *why, size_t cap) {
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) { snprintf(why, cap, "out of memory"); return NULL; }
    struct curl_slist *hdrs;
    curl_setup(h, url, &hdrs);
    curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_mem);
    curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, mem);
    long status;
    CURLcode rc = http_perform(h, hdrs, &status);
    fclose(mem);
    if (rc == CURLE_OK && status == 200) return buf;
    http_why(rc, status, why, cap);
    free(buf);
    return NULL;
}

/* ---- one file ---- */

struct sink {
    FILE *f;
    CURL *curl;
    long long offset;   /* bytes already in the file when the request went out */
    bool checked;       /* the answer's status read: a 200 to a Range request restarts the file */
};

static size_t on_body(char *p, size_t size, size_t n, void *user) {
    struct sink *s = user;
    if (!s->checked) {
        long status = 0;
        curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &status);
        if (status == 200 && s->offset > 0) {   /* the server sent the whole file: start over */
            if (fflush(s->f) || ftruncate(fileno(s->f), 0) || fseek(s->f, 0, SEEK_SET)) return 0;
            s->offset = 0;
        }
        s->checked = true;
    }
    return fwrite(p, size, n, s->f) * size;
}

static long long file_size(const char *p) { struct stat st; return stat(p, &st) ? -1 : (long long)st.st_size; }

static bool is_sha256(const char *s) { return strlen(s) == 64 && strspn(s, "0123456789abcdef") == 64; }

/* Fetch url into blob (via blob.incomplete, resumed), checked against hd. */
static int download(struct hub *h, const char *url, const char *blob, const struct head *hd) {
    char part[2420];
    snprintf(part, sizeof part, "%s.incomplete", blob);
    long long want = hd->size >= 0 ? hd->size : hd->length;
    fprintf(stderr, "kvllm: downloading %s", url);
    if (want >= 0) fprintf(stderr, " (%.1f MiB)", (double)want / 1048576.0);
    fprintf(stderr, "\n");
    char why[256] = "";
    for (int attempt = 0; attempt < 4; attempt++) {
        long long have = file_size(part);
        if (have < 0) have = 0;
        if (want >= 0 && have > want) { (void)!truncate(part, 0); have = 0; }
        if (want >= 0 && have == want) break;
        FILE *f = fopen(part, "ab");
        if (!f) { cli_error("%s: cannot write: %s", part, strerror(errno)); return 1; }
        if (have) fprintf(stderr, "kvllm: resuming %s at byte %lld\n", url, have);
        struct sink s = { f, h->curl, have, false };
        struct curl_slist *hdrs;
        curl_setup(h, url, &hdrs);
        char range[48];
        snprintf(range, sizeof range, "%lld-", have);
        if (have) curl_easy_setopt(h->curl, CURLOPT_RANGE, range);
        curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, &s);
        long status;
        CURLcode rc = http_perform(h, hdrs, &status);
        bool closed = fclose(f) == 0;
        if (rc == CURLE_WRITE_ERROR || !closed) { cli_error("%s: cannot write: %s", part, strerror(errno)); return 1; }
        if (rc == CURLE_OK && (status == 200 || status == 206)) {
            if (want < 0 || file_size(part) == want) break;
            snprintf(why, sizeof why, "%lld of %lld bytes arrived", file_size(part), want);
            continue;
        }
        if (status == 416) { (void)!truncate(part, 0); snprintf(why, sizeof why, "HTTP 416"); continue; }
        http_why(rc, status, why, sizeof why);
        if (rc == CURLE_OK || file_size(part) <= have) break;   /* an HTTP error, or no progress: do not insist */
    }
    long long got = file_size(part);
    if (want >= 0 && got != want) {
        cli_error("downloading %s failed: %s (%lld of %lld bytes kept in %s; run again to resume)", url,
                  *why ? why : "incomplete", got < 0 ? 0 : got, want, part);
        return 1;
    }
    if (is_sha256(hd->etag)) {
        char sum[65];
        if (!sha256_file(part, sum)) return 1;
        if (strcmp(sum, hd->etag)) {
            unlink(part);
            cli_error("downloading %s: SHA-256 mismatch (the hub says %s, the file has %s); the file was removed",
                      url, hd->etag, sum);
            return 1;
        }
    }
    if (rename(part, blob)) { cli_error("%s: cannot rename to %s: %s", part, blob, strerror(errno)); return 1; }
    return 0;
}

/* snapshots/COMMIT/FILE -> ../../blobs/ETAG (one more ../ per folder in FILE) */
static int link_snapshot(const struct hub *h, const char *commit, const char *file, const char *etag, char *out, size_t cap) {
    snprintf(out, cap, "%s/snapshots/%s/%s", h->repo_dir, commit, file);
    if (!make_dirs(out, false)) return 1;
    char target[1024] = "../../";
    for (const char *p = file; (p = strchr(p, '/')); p++) strcat(target, "../");
    strcat(target, "blobs/");
    strncat(target, etag, sizeof target - strlen(target) - 1);
    unlink(out);
    if (symlink(target, out)) { cli_error("%s: cannot link: %s", out, strerror(errno)); return 1; }
    char ref[2300];
    snprintf(ref, sizeof ref, "%s/refs", h->repo_dir);
    if (!make_dirs(ref, true)) return 1;
    strcat(ref, "/main");
    FILE *f = fopen(ref, "w");
    if (!f || fputs(commit, f) < 0 || fclose(f)) { cli_error("%s: cannot write", ref); if (f) fclose(f); return 1; }
    return 0;
}

/* The cached copy of FILE at refs/main, into out; false when there is none. */
static bool cached(const struct hub *h, const char *file, char *out, size_t cap) {
    char commit[128];
    if (!read_ref(h, commit, sizeof commit)) return false;
    snprintf(out, cap, "%s/snapshots/%s/%s", h->repo_dir, commit, file);
    return exists(out);
}

static bool safe_file_name(const char *f) {
    return *f && *f != '/' && !strstr(f, "..") && !strchr(f, '\\') && strspn(f, "\r\n") == 0;
}

/* FILE of the repository into the cache; its snapshot path in out. */
static int fetch_file(struct hub *h, const char *file, char *out, size_t cap) {
    if (!safe_file_name(file)) { cli_error("%s: '%s' is not a file name of the repository", h->repo, file); return 1; }
    char url[4096];
    snprintf(url, sizeof url, "%s/%s/resolve/main/%s", h->endpoint, h->repo, file);
    if (h->offline) {
        if (cached(h, file, out, cap)) return 0;
        cli_error("%s: not in the cache %s, and HF_HUB_OFFLINE is set", url, h->repo_dir);
        return 1;
    }
    struct head hd = { .size = -1, .length = -1 };
    struct curl_slist *hdrs;
    curl_setup(h, url, &hdrs);
    curl_easy_setopt(h->curl, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(h->curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h->curl, CURLOPT_HEADERDATA, &hd);
    long status;
    CURLcode rc = http_perform(h, hdrs, &status);
    if (rc != CURLE_OK || status != 200) {
        char why[256];
        http_why(rc, status, why, sizeof why);
        if (rc != CURLE_OK && cached(h, file, out, cap)) {
            fprintf(stderr, "kvllm: note: %s: %s; using the cached %s\n", url, why, out);
            return 0;
        }
        cli_error("cannot download %s: %s", url, why);
        return 1;
    }
    if (!*hd.etag || strchr(hd.etag, '/') || strstr(hd.etag, "..")) {
        cli_error("%s: the answer carries no usable ETag ('%s')", url, hd.etag);
        return 1;
    }
    const char *commit = *hd.commit && !strchr(hd.commit, '/') && !strstr(hd.commit, "..") ? hd.commit : "main";
    char blob[2400];
    snprintf(blob, sizeof blob, "%s/blobs/%s", h->repo_dir, hd.etag);
    if (!make_dirs(blob, false)) return 1;
    if (!exists(blob) && download(h, url, blob, &hd)) return 1;
    return link_snapshot(h, commit, file, hd.etag, out, cap);
}

/* ---- which files ---- */

struct listing { char **names; int n; };

static void listing_free(struct listing *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    l->names = NULL;
    l->n = 0;
}

static bool listing_add(struct listing *l, const char *name) {
    char **more = realloc(l->names, (size_t)(l->n + 1) * sizeof *more);
    if (!more) return false;
    l->names = more;
    return (l->names[l->n] = strdup(name)) && ++l->n;
}

/* The repository's files: the hub's tree API, else (offline) the cached snapshot's top folder. */
static int list_files(struct hub *h, struct listing *l) {
    char url[2048], why[256] = "HF_HUB_OFFLINE is set";
    snprintf(url, sizeof url, "%s/api/models/%s/tree/main?recursive=true", h->endpoint, h->repo);
    char *body = h->offline ? NULL : http_get(h, url, why, sizeof why);
    if (body) {
        json_object *arr = json_tokener_parse(body);
        free(body);
        if (!arr || !json_object_is_type(arr, json_type_array)) {
            json_object_put(arr);
            cli_error("%s: the answer is not a JSON list of files", url);
            return 1;
        }
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            json_object *e = json_object_array_get_idx(arr, i), *type, *path;
            if (!json_object_object_get_ex(e, "path", &path) || !json_object_is_type(path, json_type_string)) continue;
            if (json_object_object_get_ex(e, "type", &type) && strcmp(json_object_get_string(type), "file")) continue;
            if (!listing_add(l, json_object_get_string(path))) { json_object_put(arr); cli_error("out of memory"); return 1; }
        }
        json_object_put(arr);
        return 0;
    }
    char commit[128], dir[2300];
    DIR *d = read_ref(h, commit, sizeof commit) &&
             snprintf(dir, sizeof dir, "%s/snapshots/%s", h->repo_dir, commit) > 0 ? opendir(dir) : NULL;
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.' && !listing_add(l, e->d_name)) break;
    if (d) closedir(d);
    if (l->n) {
        fprintf(stderr, "kvllm: note: %s: %s; using the cached snapshot %s\n", url, why, dir);
        return 0;
    }
    cli_error("cannot list the files of %s: %s: %s", h->repo, url, why);
    return 1;
}

static bool ends_with_ci(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcasecmp(s + n - k, tail);
}

/* Whether name (a .gguf) holds quant, case-insensitively; 2 when as a whole word of the name
 * ("-Q4_K.gguf" for Q4_K, where "-Q4_K_M.gguf" holds it only as a part: 1). */
static int quant_match(const char *name, const char *quant) {
    const char *base = strrchr(name, '/') ? strrchr(name, '/') + 1 : name;
    size_t k = strlen(quant);
    int best = 0;
    for (const char *p = base; *p; p++) {
        if (strncasecmp(p, quant, k)) continue;
        bool left = p == base || !isalnum((unsigned char)p[-1]);
        bool right = p[k] == '.' || p[k] == '-';
        best = left && right ? 2 : best ? best : 1;
    }
    return best;
}

/* The .gguf QUANT picks (NULL: Q4_K_M, else Q8_0, else the first); NULL with the reason printed. */
static const char *pick_gguf(const struct hub *h, const struct listing *l, const char *quant) {
    const char *ggufs[256];
    int n = 0;
    for (int i = 0; i < l->n && n < 256; i++)
        if (ends_with_ci(l->names[i], ".gguf") && !strstr(l->names[i], "mmproj") &&
            /* of a split model, its first part (the loader reads what it names) */
            !(strstr(l->names[i], "-of-") && !strstr(l->names[i], "-00001-of-")))
            ggufs[n++] = l->names[i];
    if (!n) { cli_error("%s has no .gguf file", h->repo); return NULL; }
    const char *defaults[] = { "Q4_K_M", "Q8_0" };
    for (int pass = quant ? 0 : 1; pass < 3; pass++) {
        const char *q = pass == 0 ? quant : defaults[pass - 1];
        const char *found[256];
        int nf = 0, whole = 0;
        for (int i = 0; i < n; i++) {
            int m = quant_match(ggufs[i], q);
            if (m == 2 && !whole) nf = 0, whole = 1;   /* whole-word matches outrank partial ones */
            if (m == 2 || (m == 1 && !whole)) found[nf++] = ggufs[i];
        }
        if (nf == 1) return found[0];
        if (nf > 1 && pass == 0) {
            cli_error("%s:%s: %d files match; name one with --hf-file:", h->repo, quant, nf);
            for (int i = 0; i < nf; i++) fprintf(stderr, "  %s\n", found[i]);
            return NULL;
        }
        if (nf > 1) return found[0];
        if (pass == 0) {
            cli_error("%s has no .gguf whose name holds '%s'; it has:", h->repo, quant);
            for (int i = 0; i < n; i++) fprintf(stderr, "  %s\n", ggufs[i]);
            return NULL;
        }
    }
    return ggufs[0];
}

static bool listed(const struct listing *l, const char *name) {
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->names[i], name)) return true;
    return false;
}

/* A Hugging Face folder's files (those the loader reads); the folder in out. */
static int fetch_folder(struct hub *h, const struct listing *l, char *out, size_t cap) {
    static const char *const k_wanted[] = { "config.json", "tokenizer.json", "tokenizer_config.json",
                                            "generation_config.json", "special_tokens_map.json",
                                            "model.safetensors.index.json" };
    char path[4096];
    int rc = fetch_file(h, "config.json", out, cap);
    for (size_t k = 1; !rc && k < sizeof k_wanted / sizeof *k_wanted; k++)
        if (listed(l, k_wanted[k])) rc = fetch_file(h, k_wanted[k], path, sizeof path);
    for (int i = 0; !rc && i < l->n; i++)
        if (!strchr(l->names[i], '/') && ends_with_ci(l->names[i], ".safetensors"))
            rc = fetch_file(h, l->names[i], path, sizeof path);
    if (!rc) *strrchr(out, '/') = 0;
    return rc;
}

int hub_model_path(const char *spec, const char *file, const char *token, enum hub_prefer prefer, char **path) {
    struct hub h = { 0 };
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    char quant[64] = "";
    if (n >= sizeof h.repo || (colon && strlen(colon + 1) >= sizeof quant)) {
        cli_error("'%s': too long for a repository name", spec);
        return 1;
    }
    memcpy(h.repo, spec, n);
    if (colon) snprintf(quant, sizeof quant, "%s", colon + 1);
    if (!hub_is_repo_name(h.repo) || (colon && !*quant)) {
        cli_error("'%s' is not a repository name (owner/name, or owner/name:QUANT)", spec);
        return 1;
    }
    hub_paths(&h, token);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) || !(h.curl = curl_easy_init())) {
        cli_error("libcurl could not start");
        return 1;
    }
    char out[4096];
    struct listing l = { 0 };
    int rc;
    if (file) rc = fetch_file(&h, file, out, sizeof out);
    else if (!(rc = list_files(&h, &l))) {
        bool folder = listed(&l, "config.json") && !*quant;
        bool any_gguf = false;
        for (int i = 0; i < l.n; i++) any_gguf |= ends_with_ci(l.names[i], ".gguf");
        if (folder && (prefer == HUB_PREFER_FOLDER || !any_gguf)) rc = fetch_folder(&h, &l, out, sizeof out);
        else {
            const char *name = pick_gguf(&h, &l, *quant ? quant : NULL);
            rc = name ? fetch_file(&h, name, out, sizeof out) : 1;
        }
    }
    listing_free(&l);
    curl_easy_cleanup(h.curl);
    curl_global_cleanup();
    if (!rc && !(*path = strdup(out))) { cli_error("out of memory"); rc = 1; }
    if (!rc) fprintf(stderr, "kvllm: %s: %s\n", spec, *path);
    return rc;
}
