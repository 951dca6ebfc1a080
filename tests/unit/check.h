/* check.h — the tiny assertion kit of the C unit tests.  Each failed CHECK
 * prints where and why; main() returns check_report(). */
#ifndef KVLLM_CHECK_H
#define KVLLM_CHECK_H
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* atomic: the threaded tests CHECK from several threads at once (ThreadSanitizer build) */
static atomic_int check_failures_, check_count_;

#define CHECK(cond) do { check_count_++; if (!(cond)) { check_failures_++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { check_count_++; if (!(cond)) { check_failures_++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)

/* The test data folder: $KVLLM_SHARED, else the repository's tests/data
 * (tests/CMakeLists.txt builds its path in). */
#ifndef KVLLM_TEST_DATA
#define KVLLM_TEST_DATA "tests/data"
#endif
static inline const char *check_shared_dir(void) {
    const char *s = getenv("KVLLM_SHARED");
    return s && *s ? s : KVLLM_TEST_DATA;
}

static inline int check_report(const char *name) {
    const int n = atomic_load(&check_count_), failed = atomic_load(&check_failures_);
    printf("%s: %d checks, %d failed\n", name, n, failed);
    return failed ? 1 : 0;
}
#endif
