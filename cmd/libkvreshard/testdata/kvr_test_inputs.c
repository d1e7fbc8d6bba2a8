/*
 * kvr_test_inputs.c: bad arguments with their codes and exact messages,
 * model domains, closed and foreign handles, and keys with a NUL byte.
 */
#include <unistd.h>

#include "kvr_test.h"

void test_domain(void) {
    kvr_model m = model();
    char a[65], b[65];
    int rc = kvr_model_domain(&m, a, sizeof a, err, sizeof err);
    CHECK(rc == KVR_OK && strlen(a) == 64 && strspn(a, "0123456789abcdef") == 64, "domain %d %s %s", rc, a, err);
    m.dtype = "bf16";
    rc = kvr_model_domain(&m, b, sizeof b, err, sizeof err);
    CHECK(rc == KVR_OK && strcmp(a, b) != 0, "bf16 domain %s equals fp32's", b);
    m.dtype = "fp32";
    m.namespace_ = "tenant2";
    rc = kvr_model_domain(&m, b, sizeof b, err, sizeof err);
    CHECK(rc == KVR_OK && strcmp(a, b) != 0, "tenant domain %s equals the default's", b);
    rc = kvr_model_domain(&m, b, 64, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "out has 64 bytes; a model domain needs 65 (64 hex digits and a NUL)");
}

void test_bad_arguments(kvr_store *st) {
    kvr_store *bad_st = (kvr_store *)&failures; /* set to NULL by the failed open */
    int rc = kvr_store_open("nope", &bad_st, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "store URL \"nope\": missing scheme; use one of file://, mem://, redis+cluster://, redis://");
    CHECK(bad_st == NULL, "a failed open left the handle %p", (void *)bad_st);
    rc = kvr_store_open("mem://", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "url or store is NULL");

    rank_pool rp;
    pool_init(&rp, "layer_first", 2, 2, 0, 1, reader_split, 4);
    kvr_model m = model();
    kvr_placement pl = placement_of(&rp);
    kvr_pool pool = pool_of(&rp);

    kvr_model bad = m;
    bad.kv_heads = 0;
    reader_fails(st, bad, pl, pool, KVR_EINVAL, "model: kv_heads 0 must be positive", __LINE__);
    bad = m;
    bad.dtype = "fp64";
    reader_fails(st, bad, pl, pool, KVR_EINVAL,
                 "model: dtype \"fp64\" is unknown; dtypes are fp32, bf16, fp16 and fp8", __LINE__);
    bad.dtype = NULL;
    reader_fails(st, bad, pl, pool, KVR_EINVAL, "model: dtype is required (fp32, bf16, fp16 or fp8)", __LINE__);
    bad = m;
    bad.mla = 1;
    reader_fails(st, bad, pl, pool, KVR_EINVAL,
                 "model: v_head_dim 4 is not allowed: an mla model has one latent component", __LINE__);
    bad = m;
    bad.layers = 0;
    reader_fails(st, bad, pl, pool, KVR_EINVAL, "model: layers 0 is not from 1 to 4096", __LINE__);

    kvr_placement badp = pl;
    badp.tp = 3;
    reader_fails(st, m, badp, pool, KVR_EINVAL, "placement: kv-heads 4 is not divisible by tp 3", __LINE__);
    static const int32_t split[2] = {4, 2};
    badp = pl;
    badp.pp_layers = split;
    reader_fails(st, m, badp, pool, KVR_EINVAL, "placement: pp-layers sum to 6, not the 7 layers", __LINE__);
    badp = pl;
    badp.tp_rank = 2;
    reader_fails(st, m, badp, pool, KVR_EINVAL, "placement: rank tp 2 pp 1 is outside tp 2 x pp 2", __LINE__);

    kvr_pool badpool = pool;
    badpool.layout = "PLHD";
    reader_fails(st, m, pl, badpool, KVR_EINVAL,
                 "pool: layout PLHD is a part layout; a pool needs a pool layout (page_first, page_first_direct, "
                 "layer_first, page_head)",
                 __LINE__);
    badpool.layout = "nope";
    reader_fails(st, m, pl, badpool, KVR_EINVAL,
                 "pool: unknown layout \"nope\"; pool layouts are page_first, page_first_direct, layer_first, "
                 "page_head",
                 __LINE__);
    badpool = pool;
    badpool.nregions = 1;
    reader_fails(st, m, pl, badpool, KVR_EINVAL,
                 "pool: nregions is 1; layout layer_first of this model has 2 regions (k, v)", __LINE__);
    badpool = pool;
    badpool.slots = 0;
    reader_fails(st, m, pl, badpool, KVR_EINVAL, "pool: slots is 0; a pool holds at least one page", __LINE__);
    uint64_t small[2] = {rp.size[0], rp.size[1] - 1};
    badpool = pool;
    badpool.sizes = small;
    char want[256];
    snprintf(want, sizeof want, "pool: region v has %" PRIu64 " bytes; 4 slots of layout layer_first need %" PRIu64,
             rp.size[1] - 1, rp.size[1]);
    reader_fails(st, m, pl, badpool, KVR_EINVAL, want, __LINE__);
    void *same[2] = {rp.bases[0], (char *)rp.bases[0] + 4};
    badpool = pool;
    badpool.bases = same;
    reader_fails(st, m, pl, badpool, KVR_EINVAL, "pool: regions k and v overlap", __LINE__);

    kvr_writer *bad_w = NULL;
    rc = kvr_writer_open(st, &m, &pl, &pool, "page_first", &bad_w, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "writer: page_first is a pool layout; pages are stored in part layouts (PLHD, LPHD, HPLD)");
    kvr_reader *bad_r = NULL;
    rc = kvr_reader_open(st, NULL, &pl, &pool, &bad_r, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "model is NULL");
    rc = kvr_reader_open(st, &m, NULL, &pool, &bad_r, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "placement is NULL");
    rc = kvr_reader_open(st, &m, &pl, NULL, &bad_r, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "pool is NULL");
    rc = kvr_reader_open(st, &m, &pl, &pool, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "reader is NULL");
    rc = kvr_writer_open(st, &m, &pl, &pool, NULL, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "writer is NULL");
    rc = kvr_reader_open(NULL, &m, &pl, &pool, &bad_r, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "store is NULL");

    kvr_reader *r = open_reader(st, &rp);
    kvr_read_result res = {.size = sizeof res};
    int64_t slots[3] = {0, 1, 2};
    keys k = {0};
    keys_add(&k, "ab");
    keys_add(&k, "a_b");
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 1 \"a_b\" contains '_'; a key is the page's hash, without '_'");
    int64_t off[3] = {0, 2, 2};
    rc = kvr_reader_read(r, k.buf, off, slots, 2, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 1 is empty (offsets[1] = offsets[2] = 2)");
    int64_t n;
    rc = kvr_reader_exists(r, k.buf, k.off, -1, &n, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "n is -1; a batch has 0 to 16777216 pages");
    k = page_keys(0, 2);
    int64_t far[2] = {0, 4};
    rc = kvr_reader_read(r, k.buf, k.off, far, 2, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "slot 4 of page 1 is outside the pool's 4 slots");
    int64_t twice[2] = {3, 3};
    rc = kvr_reader_read(r, k.buf, k.off, twice, 2, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "pages 0 and 1 both go to slot 3");
    rc = kvr_reader_read(r, k.buf, k.off, NULL, 2, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "keys, offsets, slots or the output array is NULL with n = 2");
    /* A NULL output is named before the batch is looked at. */
    rc = kvr_reader_read(r, k.buf, k.off, NULL, 2, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "res is NULL");
    rc = kvr_reader_exists(r, k.buf, k.off, -1, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "complete is NULL");

    /* A message cut to fit, and no buffer at all. */
    char tiny[8];
    rc = kvr_reader_read(r, k.buf, k.off, twice, 2, &res, tiny, sizeof tiny);
    CHECK_MSG(rc, KVR_EINVAL, tiny, "pages 0");
    rc = kvr_reader_read(r, k.buf, k.off, twice, 2, &res, NULL, 0);
    CHECK(rc == KVR_EINVAL, "no message buffer: %d", rc);

    /* A panic in Go (here: a fault writing *res at address 8, which Go
     * raises as a nil dereference) returns KVR_EINTERNAL, not a crash. */
    rc = kvr_reader_read(r, NULL, NULL, NULL, 0, (kvr_read_result *)8, err, sizeof err);
    CHECK_MSG(rc, KVR_EINTERNAL, err, "internal error: runtime error: invalid memory address or nil pointer dereference");
    rc = kvr_reader_read(r, k.buf, k.off, slots, 2, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == 2, "read after a panic: %d %s", rc, err);

    /* A handle of another kind, forced in by a cast (without it the call
     * does not compile: TestHandleTypes). */
    snprintf(want, sizeof want, "handle %" PRIu64 " is a store, not a reader", ID(st));
    rc = kvr_reader_read((kvr_reader *)st, k.buf, k.off, slots, 2, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    snprintf(want, sizeof want, "handle %" PRIu64 " is a reader, not a writer", ID(r));
    uint8_t status[2];
    rc = kvr_writer_write((kvr_writer *)r, k.buf, k.off, slots, 2, status, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    snprintf(want, sizeof want, "handle %" PRIu64 " is a reader, not a store", ID(r));
    rc = kvr_store_close((kvr_store *)r, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    /* A NULL handle. */
    rc = kvr_reader_read(NULL, k.buf, k.off, slots, 2, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "reader is NULL");
    rc = kvr_writer_publish(NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "writer is NULL");
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);
}

void test_closed(void) {
    char url[64];
    kvr_store *st = NULL;
    snprintf(url, sizeof url, "mem://closed%d", (int)getpid());
    int rc = kvr_store_open(url, &st, err, sizeof err);
    CHECK(rc == KVR_OK, "store_open %s: %s", url, err);
    rank_pool rp;
    pool_init(&rp, "page_first", 1, 3, 0, 0, NULL, 2);
    fill(&rp, 0, 0);
    kvr_writer *w = open_writer(st, &rp, NULL);
    rank_pool rr;
    pool_init(&rr, "page_first", 1, 3, 0, 0, NULL, 2);
    kvr_reader *r = open_reader(st, &rr);

    /* Closing the store handle leaves its writers and readers working. */
    rc = kvr_store_close(st, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    char want[128];
    snprintf(want, sizeof want, "store handle %" PRIu64 " is closed or was never opened", ID(st));
    rc = kvr_store_close(st, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    kvr_model m = model();
    kvr_placement pl = placement_of(&rp);
    kvr_pool pool = pool_of(&rp);
    kvr_reader *h = NULL;
    rc = kvr_reader_open(st, &m, &pl, &pool, &h, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);

    write_pages(w, 0, 1, KVR_WRITTEN);
    keys k = page_keys(0, 1);
    int64_t slot = 1;
    rc = kvr_writer_write(w, k.buf, k.off, &slot, 1, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "statuses is NULL with n = 1");
    kvr_read_result res = {.size = sizeof res};
    rc = kvr_reader_read(r, k.buf, k.off, &slot, 1, &res, err, sizeof err);
    /* TP1/PP3 rank 0 wrote only its part: the page is not complete. */
    CHECK(rc == KVR_OK && res.hit == 0 && res.stop == KVR_STOP_MISS, "read after store close: %d %s", rc, err);

    rc = kvr_writer_close(w, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    snprintf(want, sizeof want, "writer handle %" PRIu64 " is closed or was never opened", ID(w));
    rc = kvr_writer_close(w, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    uint8_t status;
    rc = kvr_writer_write(w, k.buf, k.off, &slot, 1, &status, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    /* A closed handle is named before a NULL output. */
    rc = kvr_writer_write(w, k.buf, k.off, &slot, 1, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    rc = kvr_writer_publish(w, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    kvr_writer_stats ws = {.size = sizeof ws};
    rc = kvr_writer_stats_get(w, &ws, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);

    rc = kvr_reader_close(r, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    snprintf(want, sizeof want, "reader handle %" PRIu64 " is closed or was never opened", ID(r));
    rc = kvr_reader_read(r, k.buf, k.off, &slot, 1, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    int64_t n;
    rc = kvr_reader_exists(r, k.buf, k.off, 1, &n, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    rc = kvr_reader_read(r, k.buf, k.off, &slot, 1, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    rc = kvr_reader_exists(r, k.buf, k.off, 1, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    rc = kvr_reader_close(r, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    kvr_reader_stats rs = {.size = sizeof rs};
    rc = kvr_reader_stats_get(r, &rs, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, want);
    /* Closing NULL does nothing, as free(NULL); an id never opened is
     * closed. */
    strcpy(err, "x");
    rc = kvr_reader_close(NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    CHECK(kvr_writer_close(NULL, err, sizeof err) == KVR_OK && kvr_store_close(NULL, err, sizeof err) == KVR_OK,
          "close NULL: %s", err);
    rc = kvr_reader_close((kvr_reader *)(uintptr_t)0x7fffffff, err, sizeof err);
    CHECK_MSG(rc, KVR_ECLOSED, err, "reader handle 2147483647 is closed or was never opened");
    pool_free(&rp);
    pool_free(&rr);
}

/* test_nul_keys: a key with a NUL byte is refused by every call that takes
 * keys, naming the key, before anything is written or read. */
void test_nul_keys(void) {
    /* Three keys: "a", "b\0c" and "d", built by hand (keys_add uses strlen). */
    static const char buf[] = {'a', 'b', 0, 'c', 'd'};
    int64_t off[4] = {0, 1, 4, 5};
    int64_t slots[3] = {0, 1, 2};
    kvr_store *st = NULL;
    CHECK(kvr_store_open("mem://", &st, err, sizeof err) == KVR_OK, "store_open mem://: %s", err);

    rank_pool wp;
    pool_init(&wp, "page_first", 1, 1, 0, 0, NULL, 4);
    kvr_writer *w = open_writer(st, &wp, NULL);
    uint8_t status[3] = {0xee, 0xee, 0xee};
    int rc = kvr_writer_write(w, buf, off, slots, 3, status, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 1 contains a NUL byte");
    CHECK(status[0] == 0xee && status[1] == 0xee && status[2] == 0xee, "statuses written: %d %d %d", status[0],
          status[1], status[2]);
    kvr_writer_stats ws = {.size = sizeof ws};
    CHECK(kvr_writer_stats_get(w, &ws, err, sizeof err) == KVR_OK && ws.requests == 0 && ws.pages == 0,
          "writer stats after a NUL key: %" PRId64 " requests", ws.requests);
    /* The NUL is found in the key it is in, whichever key comes first. */
    int64_t last[2] = {4, 5};
    rc = kvr_writer_write(w, buf, off + 1, slots, 2, status, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 0 contains a NUL byte");
    rc = kvr_writer_write(w, buf, last, slots, 1, status, err, sizeof err);
    CHECK(rc == KVR_OK && status[0] == KVR_WRITTEN, "write of key \"d\": %d status %d %s", rc, status[0], err);
    CHECK(kvr_writer_close(w, err, sizeof err) == KVR_OK, "writer_close %s", err);
    pool_free(&wp);

    rank_pool rp;
    pool_init(&rp, "page_first", 1, 1, 0, 0, NULL, 4);
    kvr_reader *r = open_reader(st, &rp);
    int64_t n = -7;
    rc = kvr_reader_exists(r, buf, off, 3, &n, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 1 contains a NUL byte");
    CHECK(n == -7, "exists wrote *complete %" PRId64, n);
    kvr_read_result res = {.size = sizeof res, .hit = -7, .bytes = -7, .ops = -7, .stop = -7};
    rc = kvr_reader_read(r, buf, off, slots, 3, &res, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 1 contains a NUL byte");
    CHECK(res.hit == -7 && res.stop == -7, "read wrote *res: hit %" PRId64, res.hit);
    /* Before '_', and the key a NUL is in first. */
    static const char both[] = {'x', '_', 'y', 0};
    int64_t boff[3] = {0, 2, 4};
    rc = kvr_reader_exists(r, both, boff, 2, &n, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 0 \"x_\" contains '_'; a key is the page's hash, without '_'");
    int64_t one[2] = {1, 4};
    rc = kvr_reader_exists(r, both, one, 1, &n, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "key 0 contains a NUL byte");
    kvr_reader_stats rs = {.size = sizeof rs};
    CHECK(kvr_reader_stats_get(r, &rs, err, sizeof err) == KVR_OK && rs.requests == 0 && rs.pages == 0,
          "reader stats after NUL keys: %" PRId64 " requests", rs.requests);
    CHECK(kvr_reader_close(r, err, sizeof err) == KVR_OK, "reader_close %s", err);
    pool_free(&rp);
    CHECK(kvr_store_close(st, err, sizeof err) == KVR_OK, "store_close %s", err);
}
