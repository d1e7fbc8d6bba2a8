/*
 * kvr_test_bench.c: the program's timing commands, bench (the cost of an
 * empty call) and readbench (reads of python -m kvreshard.bench's pages).
 */
#include <time.h>

#include "kvr_test.h"

/* bench times n empty reads (the cost of a call alone). */
int bench(long n) {
    kvr_store *st;
    kvr_reader *r;
    if (kvr_store_open("mem://", &st, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    rank_pool rp;
    pool_init(&rp, "page_first", 1, 1, 0, 0, NULL, 1);
    r = open_reader(st, &rp);
    kvr_read_result res = {.size = sizeof res};
    for (long i = 0; i < 1000; i++) {
        kvr_reader_read(r, NULL, NULL, NULL, 0, &res, err, sizeof err);
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        if (kvr_reader_read(r, NULL, NULL, NULL, 0, &res, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "read: %s\n", err);
            return 1;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
    printf("empty kvr_reader_read: %.0f ns a call (%ld calls)\n", ns, n);
    return failures != 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* readbench times rounds reads of the pages of python -m kvreshard.bench
 * (written there with --write): rank 0/0 of TP 4 x PP 2 of the 70B-size
 * model reads them into a page_first pool, as that benchmark does, with
 * copy_workers copy workers when it is not 0 (kvr_reader_set_options). */
int readbench(const char *url, int pages, int rounds, int copy_workers) {
    if (pages < 1 || pages > 4096 || rounds < 1 || rounds > 10000) {
        fprintf(stderr, "readbench: pages 1..4096, rounds 1..10000\n");
        return 2;
    }
    kvr_store *st;
    kvr_reader *r;
    if (kvr_store_open(url, &st, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    kvr_model m = new_model(80, 8, 128, 0, 64, "bf16", "bench-70b");
    static const int32_t split[2] = {40, 40};
    kvr_placement pl = {.size = sizeof pl, .tp = 4, .pp = 2, .pp_layers = split};
    uint64_t n = (uint64_t)pages * 64 * 40 * 2 * 128 * 2;
    void *b[2] = {calloc(1, n), calloc(1, n)};
    uint64_t sz[2] = {n, n};
    kvr_pool pool = new_pool("page_first", 2, b, sz, pages);
    if (kvr_reader_open(st, &m, &pl, &pool, &r, err, sizeof err) != KVR_OK ||
        (copy_workers != 0 && set_options(r, copy_workers, 0, 0, 0, err, sizeof err) != KVR_OK)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    char *kb = malloc((size_t)pages * 16 + 1);
    int64_t *off = malloc(sizeof(int64_t) * (pages + 1)), *slots = malloc(sizeof(int64_t) * pages);
    double *t = malloc(sizeof(double) * rounds);
    off[0] = 0;
    for (int i = 0; i < pages; i++) {
        snprintf(kb + 16 * i, 17, "%016" PRIx64, (uint64_t)i * UINT64_C(0x9e3779b97f4a7c15));
        off[i + 1] = 16 * (i + 1);
        slots[i] = pages - 1 - i;
    }
    kvr_read_result res = {.size = sizeof res};
    for (int i = -1; i < rounds; i++) { /* one read first, that fills the caches */
        struct timespec a, z;
        clock_gettime(CLOCK_MONOTONIC, &a);
        int rc = kvr_reader_read(r, kb, off, slots, pages, &res, err, sizeof err);
        clock_gettime(CLOCK_MONOTONIC, &z);
        if (rc != KVR_OK || res.hit != pages) {
            fprintf(stderr, "readbench: read %" PRId64 " of %d pages: code %d: %s\n", res.hit, pages, rc, err);
            return 1;
        }
        if (i >= 0) {
            t[i] = (z.tv_sec - a.tv_sec) + (z.tv_nsec - a.tv_nsec) * 1e-9;
        }
    }
    qsort(t, rounds, sizeof *t, cmp_double);
    printf("read of %d pages (%" PRId64 " bytes): best %.3f ms, median %.3f ms (%d reads)\n", pages, res.bytes,
           t[0] * 1e3, t[rounds / 2] * 1e3, rounds);
    kvr_reader_close(r, err, sizeof err);
    kvr_store_close(st, err, sizeof err);
    free(b[0]), free(b[1]), free(kb), free(off), free(slots), free(t);
    return 0;
}
