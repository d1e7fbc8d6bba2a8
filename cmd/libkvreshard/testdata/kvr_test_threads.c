/*
 * kvr_test_threads.c: concurrency and processes: four threads reading
 * through one reader, a forked child (KVR_EFORK), the big model read from
 * two threads with two copy workers, and the GOMAXPROCS cap
 * (kvr_set_max_procs).
 */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvr_test.h"

/* Four threads read every page at once through one reader, each into its
 * own slots of the shared pool, again and again. */
#define THREADS 4
#define ROUNDS 25

typedef struct {
    kvr_reader *r;
    int id;
    int bad; /* calls that did not read every page */
    char err[256];
} thread_arg;

static void *reader_thread(void *p) {
    thread_arg *a = p;
    keys k = page_keys(0, NPAGES);
    int64_t slots[NPAGES];
    for (int i = 0; i < NPAGES; i++) {
        slots[i] = a->id * NPAGES + i;
    }
    for (int round = 0; round < ROUNDS; round++) {
        kvr_read_result res = {.size = sizeof res};
        int rc = kvr_reader_read(a->r, k.buf, k.off, slots, NPAGES, &res, a->err, sizeof a->err);
        int64_t n = 0;
        int rc2 = kvr_reader_exists(a->r, k.buf, k.off, NPAGES, &n, a->err, sizeof a->err);
        if (rc != KVR_OK || res.hit != NPAGES || res.stop != KVR_STOP_NONE || rc2 != KVR_OK || n != NPAGES) {
            a->bad++;
        }
    }
    return NULL;
}

void test_threads(kvr_store *st) {
    rank_pool rp;
    pool_init(&rp, "page_head", 2, 2, 1, 1, reader_split, THREADS * NPAGES);
    kvr_reader *r = open_reader(st, &rp);
    pthread_t t[THREADS];
    thread_arg a[THREADS];
    for (int i = 0; i < THREADS; i++) {
        a[i] = (thread_arg){.r = r, .id = i};
        CHECK(pthread_create(&t[i], NULL, reader_thread, &a[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK(a[i].bad == 0, "thread %d: %d of %d rounds did not read every page: %s", i, a[i].bad, ROUNDS, a[i].err);
    }
    for (int i = 0; i < THREADS; i++) {
        for (int p = 0; p < NPAGES; p++) {
            verify(&rp, i * NPAGES + p, p, __LINE__);
        }
    }
    kvr_reader_stats rs = {.size = sizeof rs};
    kvr_reader_stats_get(r, &rs, err, sizeof err);
    CHECK(rs.requests == THREADS * ROUNDS && rs.hits == THREADS * ROUNDS * NPAGES,
          "thread stats %" PRId64 " requests %" PRId64 " hits", rs.requests, rs.hits);
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);
}

/* A forked child gets KVR_EFORK from every call, at once. The alarm kills a
 * child that hangs instead, which the parent reports. */
void test_fork(kvr_store *st) {
    rank_pool rp;
    pool_init(&rp, "layer_first", 2, 2, 0, 0, reader_split, NPAGES);
    kvr_reader *r = open_reader(st, &rp);
    keys k = page_keys(0, NPAGES);
    int64_t slots[NPAGES];
    for (int i = 0; i < NPAGES; i++) {
        slots[i] = i;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    pid_t child = fork();
    if (child == 0) {
        alarm(20);
        int bad = 0;
        char want[256], e[256];
        snprintf(want, sizeof want,
                 "called in process %ld, a forked child of process %ld that loaded libkvreshard: Go does not "
                 "survive fork; load the library in a process started by spawn or exec",
                 (long)getpid(), (long)parent);
        kvr_read_result res = {.size = sizeof res};
        int rc = kvr_reader_read(r, k.buf, k.off, slots, NPAGES, &res, e, sizeof e);
        if (rc != KVR_EFORK || strcmp(e, want) != 0) {
            fprintf(stderr, "child: reader_read %d %s\nwant %s\n", rc, e, want);
            bad = 1;
        }
        int32_t prev, minor = -1;
        kvr_store *h;
        kvr_reader_stats rs = {.size = sizeof rs};
        if (kvr_set_max_procs(1, &prev, e, sizeof e) != KVR_EFORK || kvr_store_open("mem://", &h, e, sizeof e) != KVR_EFORK ||
            kvr_reader_stats_get(r, &rs, e, sizeof e) != KVR_EFORK || kvr_reader_close(r, e, sizeof e) != KVR_EFORK ||
            kvr_version(&minor) != KVR_ABI_VERSION || minor != KVR_ABI_MINOR ||
            strcmp(kvr_errstr(KVR_EFORK), "called in a forked child of the process that loaded the library") != 0) {
            fprintf(stderr, "child: a call did not fail with KVR_EFORK\n");
            bad = 1;
        }
        _exit(bad);
    }
    CHECK(child > 0, "fork");
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child: exited %d status %d signal %d",
          WIFEXITED(status), WEXITSTATUS(status), WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    /* The parent goes on, and the child's close did not close its reader. */
    kvr_read_result res = {.size = sizeof res};
    int rc = kvr_reader_read(r, k.buf, k.off, slots, NPAGES, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == NPAGES, "read after fork: %d %s", rc, err);
    for (int p = 0; p < NPAGES; p++) {
        verify(&rp, p, p, __LINE__);
    }
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);
}

/* The big model of test_big: 256 KiB of K and V a page for a reader of
 * TP 2, so that a read of 4 pages may run its copies on two threads. */
#define BIG_LAYERS 4
#define BIG_HEADS 2
#define BIG_DIM 128
#define BIG_PAGE 64
#define BIG_PAGES 4

static size_t big_at(int heads, int64_t s, int t, int l, int h, int e) { /* page_first: S T L H D */
    return ((((size_t)s * BIG_PAGE + t) * BIG_LAYERS + l) * heads + h) * BIG_DIM + e;
}

typedef struct {
    kvr_reader *r;
    uint32_t *reg[2];
    int first; /* the thread's first slot and page */
    int bad;
} big_thread;

static keys big_keys(int from) {
    keys k = {0};
    char s[32];
    for (int p = from; p < from + BIG_PAGES; p++) {
        snprintf(s, sizeof s, "big%d", p);
        keys_add(&k, s);
    }
    return k;
}

static void *big_read(void *arg) {
    big_thread *b = arg;
    keys k = big_keys(b->first);
    int64_t slots[BIG_PAGES];
    for (int i = 0; i < BIG_PAGES; i++) {
        slots[i] = b->first + i;
    }
    char e[512];
    kvr_read_result res = {.size = sizeof res};
    int rc = kvr_reader_read(b->r, k.buf, k.off, slots, k.n, &res, e, sizeof e);
    if (rc != KVR_OK || res.hit != BIG_PAGES) {
        fprintf(stderr, "big read from slot %d: %d hit %" PRId64 ": %s\n", b->first, rc, res.hit, e);
        b->bad++;
        return NULL;
    }
    /* Reader rank 1 of TP 2 holds head 1 of every page. */
    for (int c = 0; c < 2; c++)
        for (int p = b->first; p < b->first + BIG_PAGES; p++)
            for (int t = 0; t < BIG_PAGE; t++)
                for (int l = 0; l < BIG_LAYERS; l++)
                    for (int x = 0; x < BIG_DIM; x++) {
                        uint32_t got = b->reg[c][big_at(1, p, t, l, 0, x)], want = oracle(p, c, t, l, 1, x);
                        if (got != want && b->bad++ == 0) {
                            fprintf(stderr, "big page %d component %d token %d layer %d element %d: %08x, want %08x\n",
                                    p, c, t, l, x, got, want);
                        }
                    }
    return NULL;
}

/* test_big writes 8 pages of the big model from TP 1 and reads them into a
 * TP 2 rank's pool from two threads at once, 4 pages each, with two copy
 * workers: reads the library runs on a thread of its own while the
 * calling thread waits. Every element is checked. */
void test_big(kvr_store *st) {
    kvr_model m = new_model(BIG_LAYERS, BIG_HEADS, BIG_DIM, 0, BIG_PAGE, "fp32", "big");
    int32_t slots = 2 * BIG_PAGES;
    uint64_t wsize = (uint64_t)slots * BIG_PAGE * BIG_LAYERS * BIG_HEADS * BIG_DIM * 4;
    uint32_t *wreg[2] = {malloc(wsize), malloc(wsize)};
    uint32_t *rreg[2] = {calloc(1, wsize / 2), calloc(1, wsize / 2)};
    void *wb[2] = {wreg[0], wreg[1]}, *rb[2] = {rreg[0], rreg[1]};
    uint64_t wsz[2] = {wsize, wsize}, rsz[2] = {wsize / 2, wsize / 2};
    for (int c = 0; c < 2; c++)
        for (int p = 0; p < slots; p++)
            for (int t = 0; t < BIG_PAGE; t++)
                for (int l = 0; l < BIG_LAYERS; l++)
                    for (int h = 0; h < BIG_HEADS; h++)
                        for (int x = 0; x < BIG_DIM; x++) {
                            wreg[c][big_at(BIG_HEADS, p, t, l, h, x)] = oracle(p, c, t, l, h, x);
                        }
    kvr_placement wp = {.size = sizeof wp, .tp = 1, .pp = 1}, rpl = {.size = sizeof rpl, .tp = 2, .pp = 1, .tp_rank = 1};
    kvr_pool wpool = new_pool("page_first", 2, wb, wsz, slots), rpool = new_pool("page_first", 2, rb, rsz, slots);
    kvr_writer *w = NULL;
    kvr_reader *r = NULL;
    int rc = kvr_writer_open(st, &m, &wp, &wpool, NULL, &w, err, sizeof err);
    CHECK(rc == KVR_OK, "big writer_open: %s", err);
    for (int from = 0; from < slots; from += BIG_PAGES) {
        keys k = big_keys(from);
        int64_t ws[BIG_PAGES];
        uint8_t status[BIG_PAGES];
        for (int i = 0; i < BIG_PAGES; i++) {
            ws[i] = from + i;
        }
        rc = kvr_writer_write(w, k.buf, k.off, ws, k.n, status, err, sizeof err);
        CHECK(rc == KVR_OK && status[0] == KVR_WRITTEN && status[BIG_PAGES - 1] == KVR_WRITTEN, "big write: %d %s",
              rc, err);
    }
    kvr_writer_close(w, err, sizeof err);
    rc = kvr_reader_open(st, &m, &rpl, &rpool, &r, err, sizeof err);
    CHECK(rc == KVR_OK, "big reader_open: %s", err);
    rc = set_options(r, 2, 0, 0, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    big_thread bt[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        bt[i] = (big_thread){r, {rreg[0], rreg[1]}, i * BIG_PAGES, 0};
        CHECK(pthread_create(&th[i], NULL, big_read, &bt[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECK(bt[i].bad == 0, "big read of thread %d: %d elements wrong", i, bt[i].bad);
    }
    kvr_reader_close(r, err, sizeof err);
    for (int c = 0; c < 2; c++) {
        free(wreg[c]);
        free(rreg[c]);
    }
}

void test_max_procs(void) {
    int32_t prev = 0, now = 0;
    CHECK(kvr_set_max_procs(0, &prev, err, sizeof err) == KVR_OK && prev >= 1, "read max procs %d", prev);
    CHECK(kvr_set_max_procs(1, NULL, err, sizeof err) == KVR_OK, "set max procs 1");
    CHECK(kvr_set_max_procs(0, &now, err, sizeof err) == KVR_OK && now == 1, "max procs %d after setting 1", now);
    /* Past the bound (this host has fewer than KVR_MAX_PROCS CPUs): refused,
     * the cap unchanged and *prev not written. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus > 0 && cpus < KVR_MAX_PROCS) {
        static const int32_t over[] = {KVR_MAX_PROCS + 1, 100000, 1000000000, INT32_MAX};
        for (size_t i = 0; i < sizeof over / sizeof over[0]; i++) {
            now = -7;
            int rc = kvr_set_max_procs(over[i], &now, err, sizeof err);
            char want[128];
            snprintf(want, sizeof want, "n is %d; the cap is at most %d (KVR_MAX_PROCS, or the CPUs when more)", over[i],
                     KVR_MAX_PROCS);
            CHECK_MSG(rc, KVR_EINVAL, err, want);
            CHECK(now == -7, "max procs %d: *prev %d", over[i], now);
            if (rc == KVR_OK) {
                kvr_set_max_procs(1, NULL, err, sizeof err);
                break; /* unbounded: a larger cap could exhaust memory */
            }
            CHECK(kvr_set_max_procs(0, &now, err, sizeof err) == KVR_OK && now == 1, "max procs %d after refusing %d", now, over[i]);
        }
        CHECK(kvr_set_max_procs(KVR_MAX_PROCS, &now, err, sizeof err) == KVR_OK && now == 1, "set max procs KVR_MAX_PROCS");
        CHECK(kvr_set_max_procs(0, &now, err, sizeof err) == KVR_OK && now == KVR_MAX_PROCS, "max procs %d, want KVR_MAX_PROCS", now);
        CHECK(kvr_set_max_procs(1, NULL, err, sizeof err) == KVR_OK, "set max procs 1 again");
    }
    CHECK(kvr_set_max_procs(prev, &now, err, sizeof err) == KVR_OK && now == 1, "restore max procs");
}
