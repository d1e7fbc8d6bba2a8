/*
 * kvr_test_cp.c: context parallelism (kvr_placement's cp, cp_rank and
 * cp_interleave): pages written by TP 2 x CP 2 and read by TP 1 x CP 1
 * and TP 1 x CP 4, and bad CP placements.
 */
#include "kvr_test.h"

/* Context parallelism: a model of 16-token pages, written by TP 2 x CP 2
 * (interleave 1, SGLang's DCP: 4 ranks, each holding 8 tokens of a page)
 * and read by TP 1 x CP 1 (every token) and TP 1 x CP 4 with interleave 4
 * (4 ranks, each holding 4 contiguous tokens). Local token j of CP rank c
 * of CP size n and interleave i is token ((j / i) * n + c) * i + j % i of
 * the page: the oracle below maps it here, not the library. */
#define CP_LAYERS 3
#define CP_HEADS 2
#define CP_DIM 4
#define CP_VDIM 2
#define CP_PAGE 16
#define CP_PAGES 5

static int cp_dim(int c) { return c == 0 ? CP_DIM : CP_VDIM; }

/* cp_oracle is element e of head h, layer l, global token t of component
 * c of page p. */
static uint32_t cp_oracle(int p, int c, int t, int l, int h, int e) {
    uint64_t x = (((((uint64_t)p * 2 + c) * CP_PAGE + t) * CP_LAYERS + l) * CP_HEADS + h) * CP_DIM + e;
    x = (x + 7) * UINT64_C(0xd6e8feb86659fd93);
    x ^= x >> 32;
    return (uint32_t)x & 0x7fffffffu;
}

/* A CP rank's page_first pool (S T L H D per component, T = its tokens). */
typedef struct {
    int32_t tp, cp, tp_rank, cp_rank, il;
    int h0, nh, nt; /* its heads and tokens a page */
    int64_t slots;
    uint32_t *reg[2];
    uint64_t size[2];
    void *bases[2];
} cp_pool;

static void cp_pool_init(cp_pool *cp, int tp, int n, int tp_rank, int cp_rank, int il, int64_t slots) {
    memset(cp, 0, sizeof *cp);
    cp->tp = tp, cp->cp = n, cp->tp_rank = tp_rank, cp->cp_rank = cp_rank, cp->il = il;
    cp->nh = CP_HEADS / tp, cp->h0 = tp_rank * cp->nh, cp->nt = CP_PAGE / n;
    cp->slots = slots;
    for (int c = 0; c < 2; c++) {
        cp->size[c] = (uint64_t)slots * cp->nt * CP_LAYERS * cp->nh * cp_dim(c) * sizeof(uint32_t);
        cp->reg[c] = malloc(cp->size[c]);
        memset(cp->reg[c], 0xff, cp->size[c]);
        cp->bases[c] = cp->reg[c];
    }
}

/* cp_global is the page's token that local token j of the pool's CP rank is. */
static int cp_global(const cp_pool *cp, int j) { return ((j / cp->il) * cp->cp + cp->cp_rank) * cp->il + j % cp->il; }

static size_t cp_at(const cp_pool *cp, int c, int64_t s, int j, int l, int h, int e) {
    return (((size_t)(s * cp->nt + j) * CP_LAYERS + l) * cp->nh + h) * cp_dim(c) + e;
}

/* cp_slot fills (fill != 0) or verifies slot s as page p's share (p < 0:
 * the sentinel); it returns the mismatches and prints the first. */
static int cp_slot(cp_pool *cp, int64_t s, int p, int fill, int line) {
    int bad = 0;
    for (int c = 0; c < 2; c++)
        for (int j = 0; j < cp->nt; j++)
            for (int l = 0; l < CP_LAYERS; l++)
                for (int h = 0; h < cp->nh; h++)
                    for (int e = 0; e < cp_dim(c); e++) {
                        uint32_t *at = &cp->reg[c][cp_at(cp, c, s, j, l, h, e)];
                        uint32_t want = p < 0 ? SENTINEL : cp_oracle(p, c, cp_global(cp, j), l, cp->h0 + h, e);
                        if (fill) {
                            *at = want;
                        } else if (*at != want && bad++ == 0) {
                            fprintf(stderr,
                                    "%s:%d: tp %d x cp %d (interleave %d) rank %d/%d slot %" PRId64
                                    " page %d: component %d local token %d (token %d) layer %d head %d element %d "
                                    "is %08x, want %08x\n",
                                    __FILE__, line, cp->tp, cp->cp, cp->il, cp->tp_rank, cp->cp_rank, s, p, c, j,
                                    cp_global(cp, j), l, cp->h0 + h, e, *at, want);
                        }
                    }
    if (bad) {
        failures++;
    }
    return bad;
}

static kvr_placement cp_placement(const cp_pool *cp) {
    kvr_placement p = {.size = sizeof p, .tp = cp->tp, .pp = 1, .tp_rank = cp->tp_rank, .cp = cp->cp,
                       .cp_rank = cp->cp_rank, .cp_interleave = cp->il};
    return p;
}

static kvr_pool cp_kvr_pool(cp_pool *cp) { return new_pool("page_first", 2, cp->bases, cp->size, cp->slots); }

static kvr_model cp_model(void) {
    return new_model(CP_LAYERS, CP_HEADS, CP_DIM, CP_VDIM, CP_PAGE, "fp32", "cpmodel");
}

/* cp_read reads every page into slot p + 1 of each rank of TP 1 x CP n
 * (interleave il) and checks every element of every slot. */
static void cp_read(kvr_store *st, int n, int il) {
    keys k = page_keys(0, CP_PAGES);
    int64_t slots[CP_PAGES];
    for (int p = 0; p < CP_PAGES; p++) {
        slots[p] = p + 1;
    }
    kvr_model m = cp_model();
    for (int r = 0; r < n; r++) {
        cp_pool rp;
        cp_pool_init(&rp, 1, n, 0, r, il, CP_PAGES + 2);
        kvr_placement pl = cp_placement(&rp);
        kvr_pool pool = cp_kvr_pool(&rp);
        kvr_reader *h = NULL;
        int rc = kvr_reader_open(st, &m, &pl, &pool, &h, err, sizeof err);
        CHECK_MSG(rc, KVR_OK, err, "");
        kvr_read_result res = {.size = sizeof res};
        rc = kvr_reader_read(h, k.buf, k.off, slots, k.n, &res, err, sizeof err);
        /* This rank's bytes of every page: its tokens, every layer and head. */
        int64_t bytes = (int64_t)CP_PAGES * rp.nt * CP_LAYERS * CP_HEADS * (CP_DIM + CP_VDIM) * 4;
        CHECK(rc == KVR_OK && res.hit == CP_PAGES && res.stop == KVR_STOP_NONE && res.bytes == bytes,
              "cp %d reader %d: %d hit %" PRId64 " stop %d bytes %" PRId64 " want %" PRId64 ": %s", n, r, rc, res.hit,
              res.stop, res.bytes, bytes, err);
        for (int64_t s = 0; s < rp.slots; s++) {
            cp_slot(&rp, s, s >= 1 && s <= CP_PAGES ? (int)s - 1 : -1, 0, __LINE__);
        }
        kvr_reader_close(h, err, sizeof err);
        free(rp.reg[0]), free(rp.reg[1]);
    }
}

/* cp_fails opens a reader of TP 2 x CP cp (interleave il) rank (0, cp_rank)
 * over a pool sized for the rank and checks the exact message. */
static void cp_fails(kvr_store *st, int cp, int cp_rank, int il, const char *want, int line) {
    cp_pool rp;
    cp_pool_init(&rp, 2, 1, 0, 0, 1, 2); /* a pool of whole pages: big enough for any CP rank */
    kvr_model m = cp_model();
    kvr_placement pl = cp_placement(&rp);
    pl.cp = cp, pl.cp_rank = cp_rank, pl.cp_interleave = il;
    kvr_pool pool = cp_kvr_pool(&rp);
    reader_fails(st, m, pl, pool, KVR_EINVAL, want, line);
    free(rp.reg[0]), free(rp.reg[1]);
}

/* test_cp writes CP_PAGES pages from the four TP 2 x CP 2 ranks and reads
 * them with TP 1 x CP 1 and TP 1 x CP 4 (interleave 4), then bad input. */
void test_cp(kvr_store *st) {
    cp_pool w[4];
    kvr_model m = cp_model();
    for (int r = 0; r < 4; r++) {
        cp_pool_init(&w[r], 2, 2, r % 2, r / 2, 1, CP_PAGES);
        for (int p = 0; p < CP_PAGES; p++) {
            cp_slot(&w[r], p, p, 1, __LINE__);
        }
        kvr_placement pl = cp_placement(&w[r]);
        kvr_pool pool = cp_kvr_pool(&w[r]);
        kvr_writer *h = NULL;
        int rc = kvr_writer_open(st, &m, &pl, &pool, NULL, &h, err, sizeof err);
        CHECK_MSG(rc, KVR_OK, err, "");
        /* Before the last rank writes, the pages are not complete. */
        if (r == 3) {
            cp_pool rp;
            cp_pool_init(&rp, 1, 1, 0, 0, 1, CP_PAGES);
            kvr_placement rpl = cp_placement(&rp);
            kvr_pool rpool = cp_kvr_pool(&rp);
            kvr_reader *rh = NULL;
            keys k = page_keys(0, CP_PAGES);
            int64_t n = -1;
            rc = kvr_reader_open(st, &m, &rpl, &rpool, &rh, err, sizeof err);
            CHECK(rc == KVR_OK && kvr_reader_exists(rh, k.buf, k.off, k.n, &n, err, sizeof err) == KVR_OK && n == 0,
                  "cp pages complete before the last rank wrote: %" PRId64 " %s", n, err);
            kvr_reader_close(rh, err, sizeof err);
            free(rp.reg[0]), free(rp.reg[1]);
        }
        write_pages(h, 0, CP_PAGES, KVR_WRITTEN);
        kvr_writer_stats ws = {.size = sizeof ws};
        rc = kvr_writer_stats_get(h, &ws, err, sizeof err);
        /* Each rank's part: its 8 tokens x 3 layers x 1 head x (4 + 2) x 4 bytes. */
        int64_t part = (int64_t)(CP_PAGE / 2) * CP_LAYERS * (CP_HEADS / 2) * (CP_DIM + CP_VDIM) * 4;
        CHECK(rc == KVR_OK && ws.written == CP_PAGES && ws.bytes == CP_PAGES * part,
              "cp writer %d stats: %" PRId64 " written %" PRId64 " bytes, want %" PRId64, r, ws.written, ws.bytes,
              CP_PAGES * part);
        CHECK_MSG(kvr_writer_close(h, err, sizeof err), KVR_OK, err, "");
    }
    cp_read(st, 1, 1);
    cp_read(st, 4, 4);

    cp_fails(st, 2, 0, 3, "placement: cp interleave 3 does not divide the page's 16 tokens", __LINE__);
    cp_fails(st, 32, 0, 1, "placement: cp 32 is more than the page's 16 tokens", __LINE__);
    cp_fails(st, 2, 2, 1, "placement: rank tp 0 pp 0 cp 2 is outside tp 2 x pp 1 x cp 2", __LINE__);
    cp_fails(st, 2, -1, 1, "placement: rank tp 0 pp 0 cp -1 is outside tp 2 x pp 1 x cp 2", __LINE__);
    cp_fails(st, 0, 1, 0, "placement: rank tp 0 pp 0 cp 1 is outside tp 2 x pp 1 x cp 1", __LINE__);
    cp_fails(st, 4, 0, 8,
             "placement: cp 4 x cp interleave 8 is 32 tokens, which does not divide the page's 16 tokens", __LINE__);
    cp_fails(st, -2, 0, 1, "placement: cp -2 is not positive", __LINE__);
    cp_fails(st, 2, 0, -1, "placement: cp interleave -1 is not positive", __LINE__);

    /* A CP rank's pool holds page / cp tokens a page: one byte short of
     * that is refused, and the message says what the pool needs. */
    cp_pool rp;
    cp_pool_init(&rp, 1, 4, 0, 3, 4, 2);
    kvr_placement pl = cp_placement(&rp);
    kvr_pool pool = cp_kvr_pool(&rp);
    uint64_t small[2] = {rp.size[0], rp.size[1] - 1};
    pool.sizes = small;
    char want[256];
    snprintf(want, sizeof want, "pool: region v has %" PRIu64 " bytes; 2 slots of layout page_first need %" PRIu64,
             rp.size[1] - 1, rp.size[1]);
    reader_fails(st, m, pl, pool, KVR_EINVAL, want, __LINE__);
    CHECK(rp.size[1] == 2 * 4 * CP_LAYERS * CP_HEADS * CP_VDIM * 4, "cp 4 pool of %" PRIu64 " bytes", rp.size[1]);
    free(rp.reg[0]), free(rp.reg[1]);
    for (int r = 0; r < 4; r++) {
        free(w[r].reg[0]), free(w[r].reg[1]);
    }
}
