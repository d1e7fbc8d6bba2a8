/*
 * kvr_test_engine.c: a store over an object engine of callbacks
 * (kvr_engine, kvr_store_open_engine): the engine, in this process's
 * memory, and the tests run on it.
 */
#define _GNU_SOURCE /* memmem */
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include "kvr_test.h"

/* An object engine in this process's memory (kvr_engine), for the engine
 * store's tests from C: objects in a hash table, the first writer of a key
 * wins, reads only into registered memory (as Mooncake's range reads),
 * and hooks to evict an object and to stall reads. */
#define ENGINE_SLOTS 4096
#define ENGINE_REGS 64

typedef struct {
    char *key;
    size_t keylen;
    unsigned char *val;
    int64_t len;
} engine_obj;

typedef struct {
    pthread_mutex_t mu;
    engine_obj objs[ENGINE_SLOTS];
    struct {
        char *base;
        uint64_t len;
    } regs[ENGINE_REGS];
    int nregs;
    int reads, closed;
    int stall_ms;         /* when set, a read sleeps this long first */
    int stalls_returned;  /* reads that slept and returned */
    const char *fail_key; /* when set, a read of an object whose key contains it fails */
} mem_engine;

static uint64_t engine_hash(const char *k, size_t n) {
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++) {
        h = (h ^ (unsigned char)k[i]) * 1099511628211u;
    }
    return h;
}

/* engine_find returns the slot of key, or the empty slot it would take. */
static engine_obj *engine_find(mem_engine *e, const char *k, size_t n) {
    for (uint64_t i = engine_hash(k, n) % ENGINE_SLOTS;; i = (i + 1) % ENGINE_SLOTS) {
        engine_obj *o = &e->objs[i];
        if (o->key == NULL || (o->keylen == n && memcmp(o->key, k, n) == 0)) {
            return o;
        }
    }
}

static int engine_put(void *ctx, int64_t n, const char *keys, const int64_t *off, const void *const *frags,
                      const int64_t *frag_lens, const int64_t *frag_off, int32_t *results, char *e_err, size_t errlen) {
    mem_engine *e = ctx;
    (void)e_err;
    (void)errlen;
    pthread_mutex_lock(&e->mu);
    for (int64_t i = 0; i < n; i++) {
        size_t kn = (size_t)(off[i + 1] - off[i]);
        engine_obj *o = engine_find(e, keys + off[i], kn);
        results[i] = 0;
        if (o->key != NULL) {
            continue; /* the first writer wins */
        }
        int64_t len = 0;
        for (int64_t f = frag_off[i]; f < frag_off[i + 1]; f++) {
            len += frag_lens[f];
        }
        o->val = malloc((size_t)len + 1);
        o->len = 0;
        for (int64_t f = frag_off[i]; f < frag_off[i + 1]; f++) {
            memcpy(o->val + o->len, frags[f], (size_t)frag_lens[f]);
            o->len += frag_lens[f];
        }
        o->key = malloc(kn + 1);
        memcpy(o->key, keys + off[i], kn);
        o->keylen = kn;
    }
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static int engine_get(void *ctx, int64_t n, const char *keys, const int64_t *off, void *const *bufs, const int64_t *caps,
                      int64_t *sizes, char *e_err, size_t errlen) {
    mem_engine *e = ctx;
    (void)e_err;
    (void)errlen;
    pthread_mutex_lock(&e->mu);
    for (int64_t i = 0; i < n; i++) {
        engine_obj *o = engine_find(e, keys + off[i], (size_t)(off[i + 1] - off[i]));
        sizes[i] = o->key == NULL ? KVR_ENGINE_MISSING : o->len;
        if (o->key != NULL && o->len <= caps[i]) {
            memcpy(bufs[i], o->val, (size_t)o->len);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static int engine_sizes(void *ctx, int64_t n, const char *keys, const int64_t *off, int64_t *sizes, char *e_err,
                        size_t errlen) {
    mem_engine *e = ctx;
    (void)e_err;
    (void)errlen;
    pthread_mutex_lock(&e->mu);
    for (int64_t i = 0; i < n; i++) {
        engine_obj *o = engine_find(e, keys + off[i], (size_t)(off[i + 1] - off[i]));
        sizes[i] = o->key == NULL ? KVR_ENGINE_MISSING : o->len;
    }
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static int engine_exists(void *ctx, int64_t n, const char *keys, const int64_t *off, uint8_t *exists, char *e_err,
                         size_t errlen) {
    int64_t sizes[256];
    for (int64_t at = 0; at < n; at += 256) {
        int64_t m = n - at < 256 ? n - at : 256;
        engine_sizes(ctx, m, keys, off + at, sizes, e_err, errlen);
        for (int64_t i = 0; i < m; i++) {
            exists[at + i] = sizes[i] >= 0;
        }
    }
    return 0;
}

static int engine_read(void *ctx, int64_t nkeys, const char *keys, const int64_t *off, int64_t nranges,
                       const int64_t *key, const int64_t *offs, void *const *dst, const int64_t *lens, void *const *base,
                       const uint8_t *whole, int64_t *results, char *e_err, size_t errlen) {
    mem_engine *e = ctx;
    (void)nkeys;
    (void)whole;
    pthread_mutex_lock(&e->mu);
    int stall = e->stall_ms;
    pthread_mutex_unlock(&e->mu);
    if (stall > 0) {
        struct timespec ts = {stall / 1000, (long)(stall % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&e->mu);
    e->stalls_returned += stall > 0;
    e->reads++;
    for (int64_t j = 0; j < nranges; j++) {
        /* The destination must lie in the registration it names. */
        int ok = 0;
        for (int r = 0; r < e->nregs; r++) {
            char *lo = e->regs[r].base, *hi = lo + e->regs[r].len;
            ok |= lo == (char *)base[j] && (char *)dst[j] >= lo && (char *)dst[j] + lens[j] <= hi;
        }
        if (!ok) {
            snprintf(e_err, errlen, "range %" PRId64 ": destination not in registered memory", j);
            results[j] = -600;
            continue;
        }
        const char *k = keys + off[key[j]];
        size_t kn = (size_t)(off[key[j] + 1] - off[key[j]]);
        engine_obj *o = engine_find(e, k, kn);
        if (e->fail_key != NULL && memmem(k, kn, e->fail_key, strlen(e->fail_key)) != NULL) {
            snprintf(e_err, errlen, "range %" PRId64 ": connection reset", j);
            results[j] = -600;
        } else if (o->key == NULL) {
            results[j] = KVR_ENGINE_MISSING;
        } else if (offs[j] < 0 || offs[j] + lens[j] > o->len) {
            snprintf(e_err, errlen, "range %" PRId64 ": past the end", j);
            results[j] = -600;
        } else {
            memcpy(dst[j], o->val + offs[j], (size_t)lens[j]);
            results[j] = lens[j];
        }
    }
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* engine_drop removes the object of key; e->mu held. */
static void engine_drop(mem_engine *e, const char *k, size_t n) {
    engine_obj *o = engine_find(e, k, n);
    if (o->key == NULL) {
        return;
    }
    free(o->key);
    free(o->val);
    memset(o, 0, sizeof *o);
    /* Re-insert the run after it, so that open addressing finds them. */
    for (uint64_t i = (uint64_t)(o - e->objs + 1) % ENGINE_SLOTS; e->objs[i].key != NULL; i = (i + 1) % ENGINE_SLOTS) {
        engine_obj moved = e->objs[i];
        memset(&e->objs[i], 0, sizeof moved);
        *engine_find(e, moved.key, moved.keylen) = moved;
    }
}

static int engine_remove(void *ctx, int64_t n, const char *keys, const int64_t *off, char *e_err, size_t errlen) {
    mem_engine *e = ctx;
    (void)e_err;
    (void)errlen;
    pthread_mutex_lock(&e->mu);
    for (int64_t i = 0; i < n; i++) {
        engine_drop(e, keys + off[i], (size_t)(off[i + 1] - off[i]));
    }
    pthread_mutex_unlock(&e->mu);
    return 0;
}

static int engine_register(void *ctx, void *base, uint64_t len, char *e_err, size_t errlen) {
    mem_engine *e = ctx;
    pthread_mutex_lock(&e->mu);
    int rc = 0;
    if (e->nregs == ENGINE_REGS) {
        snprintf(e_err, errlen, "too many registrations");
        rc = -1;
    } else {
        e->regs[e->nregs].base = base;
        e->regs[e->nregs].len = len;
        e->nregs++;
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static int engine_unregister(void *ctx, void *base, uint64_t len, char *e_err, size_t errlen) {
    mem_engine *e = ctx;
    (void)len;
    pthread_mutex_lock(&e->mu);
    int rc = -1;
    for (int r = 0; r < e->nregs; r++) {
        if (e->regs[r].base == base) {
            e->regs[r] = e->regs[--e->nregs];
            rc = 0;
            break;
        }
    }
    if (rc != 0) {
        snprintf(e_err, errlen, "not registered");
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

static void engine_close(void *ctx) {
    mem_engine *e = ctx;
    e->closed++;
}

static mem_engine the_engine = {.mu = PTHREAD_MUTEX_INITIALIZER};

static kvr_engine engine_table(mem_engine *e, int64_t read_timeout_ms) {
    kvr_engine t = {.size = sizeof t, .ctx = e, .put = engine_put, .get = engine_get, .exists = engine_exists,
                    .sizes = engine_sizes, .read = engine_read, .remove = engine_remove,
                    .register_memory = engine_register, .unregister_memory = engine_unregister,
                    .close = engine_close, .read_timeout_ms = read_timeout_ms};
    return t;
}

/* engine_count counts the objects whose keys contain sub. */
static int engine_count(mem_engine *e, const char *sub) {
    int n = 0;
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < ENGINE_SLOTS; i++) {
        if (e->objs[i].key != NULL && memmem(e->objs[i].key, e->objs[i].keylen, sub, strlen(sub)) != NULL) {
            n++;
        }
    }
    pthread_mutex_unlock(&e->mu);
    return n;
}

/* test_engine_store runs the write, read and miss tests on a store over
 * the engine above, then: a store needs its callbacks; a part evicted
 * under a complete page makes it a miss, its commit goes, and the page is
 * written again; a read the engine fails is KVR_ESTORE with the pages
 * before it read; a part corrupted in the engine fails its checksums; a
 * read the engine does not answer within the store's timeout fails within
 * it, and the reader reads again after. */
void test_engine_store(void) {
    kvr_engine t = engine_table(&the_engine, 0);
    kvr_store *st = NULL;
    kvr_engine bad = t;
    bad.read = NULL;
    int rc = kvr_store_open_engine(&bad, "engine:test", &st, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "kvr_engine.read is NULL");
    rc = kvr_store_open_engine(&t, "redis://x", &st, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "engine store name \"redis://x\": want \"mooncake://host:port...\" or \"engine:<name>\"");
    rc = kvr_store_open_engine(&t, "engine:test", &st, err, sizeof err);
    CHECK(rc == KVR_OK && st != NULL, "store_open_engine: %d %s", rc, err);
    test_write(st);
    test_read(st);
    test_miss(st);
    CHECK(engine_count(&the_engine, "/done") == NPAGES, "%d commits, want %d", engine_count(&the_engine, "/done"), NPAGES);
    CHECK(the_engine.reads > 0, "no engine reads");

    /* Evict part 2 (PP rank 2's) of page 3: a miss at page 3, and the page
     * is removed whole (its other parts, commit and claim); written again
     * by every rank, it reads. */
    keys k3 = page_keys(3, 4);
    char sub[64];
    snprintf(sub, sizeof sub, "%.*s", (int)k3.off[1], k3.buf);
    char part2[96];
    snprintf(part2, sizeof part2, "%s_", sub); /* page keys: kvreshard_<hash>_<domain> */
    int evicted = 0;
    pthread_mutex_lock(&the_engine.mu);
    for (int i = 0; i < ENGINE_SLOTS; i++) {
        engine_obj *o = &the_engine.objs[i];
        if (o->key != NULL && memmem(o->key, o->keylen, part2, strlen(part2)) != NULL && o->keylen > 2 &&
            memcmp(o->key + o->keylen - 2, "/2", 2) == 0 && memmem(o->key, o->keylen, "/p/", 3) != NULL) {
            engine_drop(&the_engine, o->key, o->keylen);
            evicted++;
            break;
        }
    }
    pthread_mutex_unlock(&the_engine.mu);
    CHECK(evicted == 1, "evicted %d parts", evicted);
    rank_pool rp;
    pool_init(&rp, "layer_first", 2, 2, 0, 1, reader_split, NPAGES + 4); /* PP rank 1: layers 4-6, in part 2 */
    kvr_reader *r = open_reader(st, &rp);
    keys k = page_keys(0, NPAGES);
    int64_t slots[NPAGES];
    for (int p = 0; p < NPAGES; p++) {
        slots[p] = p;
    }
    kvr_read_result res = {.size = sizeof res};
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == 3 && res.stop == KVR_STOP_MISS, "read past an evicted part: %d hit %" PRId64 " stop %d %s",
          rc, res.hit, res.stop, err);
    CHECK(engine_count(&the_engine, "/done") == NPAGES - 1, "the commit of the page is removed: %d commits",
          engine_count(&the_engine, "/done"));
    CHECK(engine_count(&the_engine, sub) == 0, "%d objects of the page are left", engine_count(&the_engine, sub));
    for (int i = 0; i < 3; i++) {
        kvr_writer *w = open_writer(st, &writers[i], NULL);
        write_pages(w, 3, 4, KVR_WRITTEN);
        kvr_writer_close(w, err, sizeof err);
    }
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == NPAGES && res.stop == KVR_STOP_NONE, "read after the rewrite: %d hit %" PRId64 " %s", rc,
          res.hit, err);
    for (int p = 0; p < NPAGES; p++) {
        verify(&rp, p, p, __LINE__);
    }

    /* A read of page 5 that the engine fails is KVR_ESTORE, and *res holds
     * the hit prefix, read in full. */
    char key5[32];
    snprintf(key5, sizeof key5, "%.*s", (int)(k.off[6] - k.off[5]), k.buf + k.off[5]);
    memset(rp.reg[0], 0xff, rp.size[0]);
    memset(rp.reg[1], 0xff, rp.size[1]);
    the_engine.fail_key = key5;
    memset(&res, 0xee, sizeof res);
    res.size = sizeof res;
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    the_engine.fail_key = NULL;
    CHECK(rc == KVR_ESTORE && res.hit == 5 && res.stop == KVR_STOP_FAILED && res.bytes > 0 &&
              strstr(err, "connection reset") != NULL,
          "read of a failing page: %d hit %" PRId64 " stop %d: %s", rc, res.hit, res.stop, err);
    for (int p = 0; p < 5; p++) {
        verify(&rp, p, p, __LINE__);
    }
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);

    /* A part whose bytes changed in the store fails its checksums: the
     * read stops at its page with KVR_STOP_CHECKSUM, and KVR_OK. */
    char key7[32];
    snprintf(key7, sizeof key7, "%.*s_", (int)(k.off[8] - k.off[7]), k.buf + k.off[7]);
    int flipped = 0;
    pthread_mutex_lock(&the_engine.mu);
    for (int i = 0; i < ENGINE_SLOTS; i++) {
        engine_obj *o = &the_engine.objs[i];
        if (o->key != NULL && memmem(o->key, o->keylen, key7, strlen(key7)) != NULL && o->keylen > 2 &&
            memcmp(o->key + o->keylen - 2, "/2", 2) == 0 && memmem(o->key, o->keylen, "/p/", 3) != NULL) {
            o->val[o->len / 2] ^= 0x5a;
            flipped++;
        }
    }
    pthread_mutex_unlock(&the_engine.mu);
    CHECK(flipped == 1, "flipped %d parts", flipped);
    static const int32_t checked_split[2] = {4, 3};
    pool_init(&rp, "page_first", 1, 2, 0, 1, checked_split, NPAGES); /* every byte of part 2 */
    r = open_reader(st, &rp);
    rc = set_options(r, 1, 0, 0, 1, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == 7 && res.stop == KVR_STOP_CHECKSUM && strstr(err, "checksum") != NULL,
          "read of a corrupt part: %d hit %" PRId64 " stop %d: %s", rc, res.hit, res.stop, err);
    kvr_reader_stats rs = {.size = sizeof rs};
    rc = kvr_reader_stats_get(r, &rs, err, sizeof err);
    CHECK(rc == KVR_OK && rs.checksum_errors == 1, "checksum errors %" PRId64, rs.checksum_errors);
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);
    rc = kvr_store_close(st, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    CHECK(the_engine.closed == 1, "the engine's close was called %d times", the_engine.closed);
    CHECK(the_engine.nregs == 0, "%d registrations left", the_engine.nregs);

    /* A read that the engine answers after the store's timeout fails within
     * it, and reads again once the engine answers in time. */
    the_engine.closed = 0;
    t = engine_table(&the_engine, 200);
    rc = kvr_store_open_engine(&t, "engine:slow", &st, err, sizeof err);
    CHECK(rc == KVR_OK, "store_open_engine: %d %s", rc, err);
    pool_init(&rp, "layer_first", 2, 2, 0, 1, reader_split, NPAGES);
    r = open_reader(st, &rp);
    pthread_mutex_lock(&the_engine.mu);
    the_engine.stall_ms = 1500;
    the_engine.stalls_returned = 0;
    pthread_mutex_unlock(&the_engine.mu);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(rc == KVR_ESTORE && res.hit == 0 && res.stop == KVR_STOP_FAILED && strstr(err, "did not return within 200ms") != NULL,
          "stalled read: %d hit %" PRId64 " stop %d %s", rc, res.hit, res.stop, err);
    CHECK(t1.tv_sec - t0.tv_sec < 60, "the stalled read took %ld s", (long)(t1.tv_sec - t0.tv_sec));
    /* Wait for the stalled call to return from the engine. */
    pthread_mutex_lock(&the_engine.mu);
    the_engine.stall_ms = 0;
    pthread_mutex_unlock(&the_engine.mu);
    for (int returned = 0; !returned;) {
        struct timespec ms10 = {0, 10000000L};
        nanosleep(&ms10, NULL);
        pthread_mutex_lock(&the_engine.mu);
        returned = the_engine.stalls_returned > 0;
        pthread_mutex_unlock(&the_engine.mu);
    }
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == NPAGES, "read after the stall: %d hit %" PRId64 " %s", rc, res.hit, err);
    for (int p = 0; p < NPAGES; p++) {
        verify(&rp, p, p, __LINE__);
    }
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);
    rc = kvr_store_close(st, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
}
