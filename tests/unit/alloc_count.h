/* alloc_count.h — counts the allocations a test makes on any thread while
 * g_counting is set (the no-allocation-in-a-step tests).  Include it from
 * exactly one file of a test: it defines the allocator.
 *
 * In a plain build the test defines malloc, calloc, realloc and the aligned
 * allocations itself (forwarding to glibc's __libc_* entry points); under
 * AddressSanitizer, which owns malloc, it counts through ASan's malloc hook.
 * Call alloc_count_install() first. */
#ifndef KVLLM_ALLOC_COUNT_H
#define KVLLM_ALLOC_COUNT_H
#include <stdatomic.h>
#include <stddef.h>

static atomic_int g_counting, g_allocs;

static void alloc_note(size_t n) {
    if (atomic_load(&g_counting)) atomic_fetch_add(&g_allocs, 1);
    (void)n;
}

#if defined(__SANITIZE_ADDRESS__)
/* declared here, not from <sanitizer/allocator_interface.h>: gcc ships no such header (clang
 * does), while both ASan runtimes export the function */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
static void alloc_hook_malloc(const volatile void *p, size_t n) { (void)p; alloc_note(n); }
static void alloc_hook_free(const volatile void *p) { (void)p; }
static void alloc_count_install(void) { __sanitizer_install_malloc_and_free_hooks(alloc_hook_malloc, alloc_hook_free); }
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
void *malloc(size_t n) { alloc_note(n); return __libc_malloc(n); }
void *calloc(size_t a, size_t b) { alloc_note(a * b); return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { alloc_note(n); return __libc_realloc(p, n); }
void *aligned_alloc(size_t al, size_t n) { alloc_note(n); return __libc_memalign(al, n); }
int posix_memalign(void **p, size_t al, size_t n) { alloc_note(n); *p = __libc_memalign(al, n); return *p ? 0 : 12; }
static void alloc_count_install(void) {}
#endif
#endif
