/*
 * kvr_test_rw.c: TP1/PP3 writers write pages from page_first pools (two
 * part layouts, a partial page, refused writes); TP2/PP2 readers read them
 * into layer_first, page_head and page_first_direct pools; misses, other
 * domains, and a reader's options (copy workers, prefetch budget, checked
 * parts).
 */
#include "kvr_test.h"

/* A page written by writer ranks 0 and 1 only: never complete. */
#define PARTIAL NPAGES

void test_write(kvr_store *st) {
    kvr_writer *w[3], *h[3];
    for (int r = 0; r < 3; r++) {
        pool_init(&writers[r], "page_first", 1, 3, 0, r, NULL, NPAGES + 1);
        for (int p = 0; p <= PARTIAL; p++) {
            fill(&writers[r], p, p);
        }
        w[r] = open_writer(st, &writers[r], NULL);    /* PLHD */
        h[r] = open_writer(st, &writers[r], "HPLD"); /* same pool, another part layout */
    }
    int rc = kvr_writer_publish(w[0], err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");

    /* Pages 0-5 in PLHD, 6-9 in HPLD: one read below spans both layouts. */
    for (int r = 0; r < 3; r++) {
        write_pages(w[r], 0, 6, KVR_WRITTEN);
        write_pages(h[r], 6, NPAGES, KVR_WRITTEN);
    }
    write_pages(w[0], PARTIAL, PARTIAL + 1, KVR_WRITTEN);
    write_pages(w[1], PARTIAL, PARTIAL + 1, KVR_WRITTEN);

    /* Complete pages are skipped, in any layout. */
    write_pages(w[2], 0, 2, KVR_COMPLETE);
    write_pages(h[2], 0, 2, KVR_COMPLETE);

    /* The partial page is claimed by PLHD: an HPLD write of it is refused,
     * and the message names it. */
    keys k = page_keys(PARTIAL, PARTIAL + 1);
    int64_t slot = PARTIAL;
    uint8_t status = 0xee;
    rc = kvr_writer_write(h[2], k.buf, k.off, &slot, 1, &status, err, sizeof err);
    CHECK(rc == KVR_OK && status == KVR_REFUSED, "refused write: %d status %d %s", rc, status, err);
    char want[256];
    snprintf(want, sizeof want, "page 0 (key \"%.*s\") refused: ", (int)k.off[1], k.buf);
    CHECK(strncmp(err, want, strlen(want)) == 0 && strstr(err, "object is being written with another layout"),
          "refused message %s", err);

    kvr_writer_stats ws = {.size = sizeof ws};
    rc = kvr_writer_stats_get(w[0], &ws, err, sizeof err);
    CHECK(rc == KVR_OK, "writer_stats_get %d %s", rc, err);
    /* Rank 0/0's part: 3 layers x 4 heads x page x (K + V dims) x 4 bytes. */
    int64_t part = 3 * KV_HEADS * PAGE * (HEAD_DIM + V_HEAD_DIM) * 4;
    CHECK(ws.requests == 2 && ws.pages == 7 && ws.written == 7 && ws.complete == 0 && ws.refused == 0 &&
              ws.replica == 0 && ws.failed == 0 && ws.bytes == 7 * part,
          "writer 0 stats: %" PRId64 " requests %" PRId64 " pages %" PRId64 " written %" PRId64 " bytes",
          ws.requests, ws.pages, ws.written, ws.bytes);
    rc = kvr_writer_stats_get(h[2], &ws, err, sizeof err);
    CHECK(rc == KVR_OK && ws.requests == 3 && ws.pages == 7 && ws.written == 4 && ws.complete == 2 &&
              ws.refused == 1 && ws.failed == 0,
          "writer h2 stats: %d: %" PRId64 " written %" PRId64 " complete %" PRId64 " refused", rc, ws.written,
          ws.complete, ws.refused);

    for (int r = 0; r < 3; r++) {
        CHECK(kvr_writer_close(w[r], err, sizeof err) == KVR_OK, "writer_close %s", err);
        CHECK(kvr_writer_close(h[r], err, sizeof err) == KVR_OK, "writer_close %s", err);
    }
}

/* read_all reads pages 0..NPAGES-1 into slot 2 + (NPAGES-1-p) of reader r
 * and verifies every slot: the read pages, and the sentinel in the others. */
static void read_all(kvr_reader *r, rank_pool *rp) {
    keys k = page_keys(0, NPAGES);
    int64_t slots[NPAGES];
    for (int p = 0; p < NPAGES; p++) {
        slots[p] = 2 + (NPAGES - 1 - p);
    }
    kvr_read_result res = {.size = sizeof res};
    memset(&res, 0xee, sizeof res);
    res.size = sizeof res;
    int rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == NPAGES && res.stop == KVR_STOP_NONE && err[0] == 0,
          "read %s rank %d/%d: %d hit %" PRId64 " stop %d: %s", rp->layout, rp->tp_rank, rp->pp_rank, rc, res.hit,
          res.stop, err);
    /* The rank's bytes of every page, no more. */
    int64_t page = (int64_t)rp->nl * rp->nh * PAGE * (HEAD_DIM + V_HEAD_DIM) * 4;
    CHECK(res.bytes == NPAGES * page && res.ops > 0, "read bytes %" PRId64 " want %" PRId64 ", ops %" PRId64,
          res.bytes, NPAGES * page, res.ops);
    for (int64_t s = 0; s < rp->slots; s++) {
        int p = s >= 2 && s < 2 + NPAGES ? NPAGES - 1 - (int)(s - 2) : -1;
        verify(rp, s, p, __LINE__);
    }
}

void test_read(kvr_store *st) {
    /* TP2/PP2 with the readers' own split: layer_first on PP rank 0,
     * page_head on PP rank 1, and one page_first_direct rank. */
    const char *layout[2] = {"layer_first", "page_head"};
    for (int pp = 0; pp < 2; pp++) {
        for (int tp = 0; tp < 2; tp++) {
            rank_pool rp;
            pool_init(&rp, layout[pp], 2, 2, tp, pp, reader_split, NPAGES + 4);
            kvr_reader *r = open_reader(st, &rp);
            read_all(r, &rp);
            kvr_reader_stats rs = {.size = sizeof rs};
            int rc = kvr_reader_stats_get(r, &rs, err, sizeof err);
            CHECK(rc == KVR_OK && rs.requests == 1 && rs.pages == NPAGES && rs.hits == NPAGES && rs.misses == 0 &&
                      rs.manifests_rejected == 0 && rs.bytes > 0,
                  "reader stats: %d: %" PRId64 " requests %" PRId64 " hits", rc, rs.requests, rs.hits);
            CHECK(kvr_reader_close(r, err, sizeof err) == KVR_OK, "reader_close %s", err);
            pool_free(&rp);
        }
    }
    rank_pool rp;
    pool_init(&rp, "page_first_direct", 2, 2, 1, 0, reader_split, NPAGES + 2);
    kvr_reader *r = open_reader(st, &rp);
    read_all(r, &rp);
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);
}

void test_miss(kvr_store *st) {
    rank_pool rp;
    pool_init(&rp, "layer_first", 2, 2, 1, 1, reader_split, 8);
    kvr_reader *r = open_reader(st, &rp);

    keys all = page_keys(0, NPAGES);
    int64_t n = -1;
    int rc = kvr_reader_exists(r, all.buf, all.off, all.n, &n, err, sizeof err);
    CHECK(rc == KVR_OK && n == NPAGES, "exists all: %d %" PRId64 " %s", rc, n, err);

    /* Pages 0, 1, the partial page, 3: two leading pages. */
    keys k = page_keys(0, 2);
    keys_add_page(&k, PARTIAL);
    keys_add_page(&k, 3);
    rc = kvr_reader_exists(r, k.buf, k.off, k.n, &n, err, sizeof err);
    CHECK(rc == KVR_OK && n == 2, "exists with partial: %d %" PRId64 " %s", rc, n, err);
    int64_t slots[4] = {4, 5, 6, 7};
    kvr_read_result res = {.size = sizeof res};
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == 2 && res.stop == KVR_STOP_MISS, "read with partial: %d hit %" PRId64 " stop %d",
          rc, res.hit, res.stop);
    char want[256];
    snprintf(want, sizeof want, "page missing or incomplete: kvreshard_%.*s_", (int)(k.off[3] - k.off[2]),
             k.buf + k.off[2]);
    CHECK(strncmp(err, want, strlen(want)) == 0, "miss message %s, want %s...", err, want);
    verify(&rp, 4, 0, __LINE__);
    verify(&rp, 5, 1, __LINE__);
    verify(&rp, 6, -1, __LINE__); /* partial data is never consumed */
    verify(&rp, 7, -1, __LINE__);

    /* A key never written. */
    keys none = {0};
    keys_add(&none, "deadbeef");
    rc = kvr_reader_exists(r, none.buf, none.off, 1, &n, err, sizeof err);
    CHECK(rc == KVR_OK && n == 0, "exists none: %d %" PRId64, rc, n);
    rc = kvr_reader_read(r, none.buf, none.off, slots, 1, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == 0 && res.bytes == 0 && res.stop == KVR_STOP_MISS, "read none: %d %" PRId64, rc,
          res.hit);
    CHECK(strncmp(err, "page missing or incomplete: kvreshard_deadbeef_", 47) == 0, "miss message %s", err);

    kvr_reader_stats rs = {.size = sizeof rs};
    kvr_reader_stats_get(r, &rs, err, sizeof err);
    CHECK(rs.requests == 2 && rs.pages == 5 && rs.hits == 2 && rs.misses == 3, "miss stats %" PRId64 " hits %" PRId64
          " misses", rs.hits, rs.misses);
    kvr_reader_close(r, err, sizeof err);

    /* Another model name is another domain: the same keys are not its pages. */
    kvr_model m = model();
    m.name = "other";
    kvr_placement pl = placement_of(&rp);
    kvr_pool pool = pool_of(&rp);
    rc = kvr_reader_open(st, &m, &pl, &pool, &r, err, sizeof err);
    CHECK(rc == KVR_OK, "reader_open other: %s", err);
    rc = kvr_reader_exists(r, all.buf, all.off, all.n, &n, err, sizeof err);
    CHECK(rc == KVR_OK && n == 0, "exists other model: %" PRId64, n);
    kvr_reader_close(r, err, sizeof err);
    pool_free(&rp);
}

/* test_options sets a reader's copy workers and prefetch budget
 * (kvr_reader_set_options): bad values with their messages, the budget in
 * pages and in bytes, and back to no budget. */
void test_options(kvr_store *st) {
    rank_pool rp;
    pool_init(&rp, "layer_first", 2, 2, 0, 1, reader_split, NPAGES + 4);
    kvr_reader *r = open_reader(st, &rp);
    int rc = set_options(r, -1, 0, 0, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "copy_workers is -1; want 0 (GOMAXPROCS) to 1024");
    rc = set_options(r, 1025, 0, 0, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "copy_workers is 1025; want 0 (GOMAXPROCS) to 1024");
    rc = set_options(r, 1, -1, 0, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "max_pages is -1; want 0 (no limit) or more");
    rc = set_options(r, 1, 0, INT64_MIN, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "max_bytes is -9223372036854775808; want 0 (no limit) or more");
    rc = set_options(r, 1, 0, 0, 2, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "check_parts is 2; want 0 (no checks) or 1");
    rc = set_options(r, 1, 0, 0, -1, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "check_parts is -1; want 0 (no checks) or 1");
    /* The struct's size: too small, and an option of a newer header. */
    kvr_reader_options small = {.size = 8};
    rc = kvr_reader_set_options(r, &small, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "kvr_reader_options.size is 8; this library's kvr_reader_options has 32 bytes: set size to "
              "sizeof(kvr_reader_options)");
    struct {
        kvr_reader_options o;
        int64_t newer;
    } grown = {{.size = sizeof grown}, 7};
    rc = kvr_reader_set_options(r, &grown.o, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "kvr_reader_options byte 32 is 7: a field this library (ABI 2.1) does not know is set");
    grown.newer = 0;
    /* The reserved field is where ABI 2.2 would put its next field. */
    grown.o.reserved = 1;
    rc = kvr_reader_set_options(r, &grown.o, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "kvr_reader_options byte 28 is 1: a field this library (ABI 2.1) does not know is set");
    grown.o.reserved = 0;
    rc = kvr_reader_set_options(r, &grown.o, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    rc = kvr_reader_set_options(r, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "options is NULL");

    keys k = page_keys(0, NPAGES);
    int64_t slots[NPAGES];
    for (int p = 0; p < NPAGES; p++) {
        slots[p] = p;
    }
    int64_t page = (int64_t)rp.nl * rp.nh * PAGE * (HEAD_DIM + V_HEAD_DIM) * 4;
    kvr_read_result res = {.size = sizeof res};
    /* 3 pages, then 4 pages and one byte: 4 pages. */
    rc = set_options(r, 1, 3, 0, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == 3 && res.stop == KVR_STOP_BUDGET && res.bytes == 3 * page,
          "read with 3 pages' budget: %d hit %" PRId64 " stop %d bytes %" PRId64, rc, res.hit, res.stop, res.bytes);
    CHECK(strcmp(err, "prefetch budget reached: 3 pages") == 0, "budget message %s", err);
    for (int64_t s = 0; s < rp.slots; s++) {
        verify(&rp, s, s < 3 ? (int)s : -1, __LINE__);
    }
    rc = set_options(r, 4, 0, 4 * page + 1, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == 4 && res.stop == KVR_STOP_BUDGET, "read with 4 pages' bytes: %d hit %" PRId64,
          rc, res.hit);
    char want[128];
    snprintf(want, sizeof want, "prefetch budget reached: %" PRId64 " bytes", 4 * page + 1);
    CHECK(strcmp(err, want) == 0, "budget message %s, want %s", err, want);
    rc = set_options(r, 0, 0, 0, 0, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == NPAGES && res.stop == KVR_STOP_NONE, "read without budget: %d hit %" PRId64, rc,
          res.hit);
    for (int64_t s = 0; s < rp.slots; s++) {
        verify(&rp, s, s < NPAGES ? (int)s : -1, __LINE__);
    }
    kvr_reader_stats rs = {.size = sizeof rs};
    rc = kvr_reader_stats_get(r, &rs, err, sizeof err);
    CHECK(rc == KVR_OK && rs.parts_checked == 0, "unchecked reads checked %" PRId64 " parts", rs.parts_checked);
    /* Checked: every part the rank reads, of every page. */
    rc = set_options(r, 0, 0, 0, 1, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    memset(rp.reg[0], 0, rp.size[0]);
    memset(rp.reg[1], 0, rp.size[1]);
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == NPAGES && res.stop == KVR_STOP_NONE, "checked read: %d hit %" PRId64, rc, res.hit);
    for (int64_t s = 0; s < NPAGES; s++) {
        verify(&rp, s, (int)s, __LINE__);
    }
    /* The counters go on across the changes. */
    rc = kvr_reader_stats_get(r, &rs, err, sizeof err);
    CHECK(rc == KVR_OK && rs.requests == 4 && rs.pages == 4 * NPAGES && rs.hits == 3 + 4 + 2 * NPAGES &&
              rs.misses == 2 * NPAGES - 7 && rs.bytes == (3 + 4 + 2 * NPAGES) * page && rs.parts_checked > 0 &&
              rs.checksum_errors == 0,
          "reader stats: %" PRId64 " requests %" PRId64 " hits %" PRId64 " misses %" PRId64 " parts checked",
          rs.requests, rs.hits, rs.misses, rs.parts_checked);

    /* A writer is not a reader; a closed reader is closed. */
    kvr_writer *w = open_writer(st, &writers[0], NULL);
    rc = set_options((kvr_reader *)w, 1, 0, 0, 0, err, sizeof err);
    char msg[128];
    snprintf(msg, sizeof msg, "handle %" PRIu64 " is a writer, not a reader", ID(w));
    CHECK_MSG(rc, KVR_EINVAL, err, msg);
    kvr_writer_close(w, err, sizeof err);
    CHECK(kvr_reader_close(r, err, sizeof err) == KVR_OK, "reader_close %s", err);
    rc = set_options(r, 1, 0, 0, 0, err, sizeof err);
    snprintf(msg, sizeof msg, "reader handle %" PRIu64 " is closed or was never opened", ID(r));
    CHECK_MSG(rc, KVR_ECLOSED, err, msg);
    pool_free(&rp);
}
