/*
 * kvreshard_test.c: libkvreshard used from C the way a C++ serving
 * framework would, linked through kvreshard.h only.
 *
 *     kvreshard_test DIR         run every test against the file store in DIR
 *     kvreshard_test bench N     time N empty kvr_reader_read calls (n = 0)
 *     kvreshard_test readbench URL PAGES ROUNDS [COPY_WORKERS]
 *                                time ROUNDS reads of the PAGES pages that
 *                                python -m kvreshard.bench --write wrote
 *
 * Three writer ranks of TP1/PP3 write pages from page_first pools; four
 * reader ranks of TP2/PP2 (its own PP split) read them into layer_first,
 * page_head and page_first_direct pools. TP 2 x CP 2 ranks write pages of
 * another model that TP 1 x CP 1 and TP 1 x CP 4 ranks read (test_cp).
 * Layouts defined at run time (kvr_define_layout) move pages between
 * page_first and vllm_host pools (test_layouts); the ABI's versions, codes
 * and struct sizes are checked (test_abi), and a store that fails a read
 * (test_engine_store).
 * Every element is checked against an oracle computed here from its logical
 * [component, token, layer, head, element] index: the library computes no
 * expectation. Prints "ok" and
 * exits 0 when every check passed; otherwise each failure is printed with
 * its line and the exit status is 1.
 */
#define _GNU_SOURCE /* memmem */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvreshard.h"

/* The model: K and V head dims differ, 7 layers split 3/2/2 by the writers'
 * even split and 4/3 by the readers' own. */
#define LAYERS 7
#define KV_HEADS 4
#define HEAD_DIM 8
#define V_HEAD_DIM 4
#define PAGE 4
#define NPAGES 10
#define SENTINEL 0xffffffffu

static int failures;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            failures++;                                                          \
            fprintf(stderr, "kvreshard_test.c:%d: check failed: %s: ", __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fprintf(stderr, "\n");                                               \
        }                                                                        \
    } while (0)

/* CHECK_MSG checks a call's code and its exact message. */
#define CHECK_MSG(rc, want_rc, err, want_msg)                                         \
    do {                                                                              \
        CHECK((rc) == (want_rc), "code %d, want %d (%s)", (rc), (want_rc), (err));   \
        CHECK(strcmp((err), (want_msg)) == 0, "message\n  %s\nwant\n  %s", (err), (want_msg)); \
    } while (0)

/* oracle is the content of element e of head h, layer l, token t of
 * component c (0 K, 1 V) of page p: a mix of the logical index, never the
 * sentinel. */
static uint32_t oracle(int p, int c, int t, int l, int h, int e) {
    uint64_t x = (((((uint64_t)p * 2 + c) * PAGE + t) * LAYERS + l) * KV_HEADS + h) * HEAD_DIM + e;
    x = (x + 1) * UINT64_C(0x9e3779b97f4a7c15);
    x ^= x >> 31;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 29;
    return (uint32_t)x & 0x7fffffffu;
}

static int dim(int c) { return c == 0 ? HEAD_DIM : V_HEAD_DIM; }

/* rank_pool is one rank's pool, laid out by this file, not the library. */
typedef struct {
    const char *layout;
    int32_t tp, pp, tp_rank, pp_rank;
    const int32_t *pp_layers;
    int l0, nl, h0, nh; /* the rank's layers and heads */
    int64_t slots;
    uint32_t *reg[2];
    uint64_t size[2];
    void *bases[2];
} rank_pool;

static void pool_init(rank_pool *rp, const char *layout, int tp, int pp, int tp_rank, int pp_rank,
                      const int32_t *pp_layers, int64_t slots) {
    memset(rp, 0, sizeof *rp);
    rp->layout = layout;
    rp->tp = tp, rp->pp = pp, rp->tp_rank = tp_rank, rp->pp_rank = pp_rank;
    rp->pp_layers = pp_layers;
    rp->slots = slots;
    /* The stage's layers: the given split, or even with the remainder to
     * the first stages. */
    int lo = 0, n = 0;
    for (int s = 0; s <= pp_rank; s++) {
        lo += n;
        n = pp_layers ? pp_layers[s] : LAYERS / pp + (s < LAYERS % pp);
    }
    rp->l0 = lo, rp->nl = n;
    rp->nh = KV_HEADS / tp, rp->h0 = tp_rank * rp->nh;
    for (int c = 0; c < 2; c++) {
        rp->size[c] = (uint64_t)slots * PAGE * rp->nl * rp->nh * dim(c) * sizeof(uint32_t);
        rp->reg[c] = malloc(rp->size[c]);
        memset(rp->reg[c], 0xff, rp->size[c]);
        rp->bases[c] = rp->reg[c];
    }
}

static void pool_free(rank_pool *rp) {
    free(rp->reg[0]);
    free(rp->reg[1]);
}

/* at is the element index of (slot s, token t, local layer l, local head h,
 * element e) in component c's region, for each pool layout. */
static size_t at(const rank_pool *rp, int c, int64_t s, int t, int l, int h, int e) {
    size_t S = rp->slots, L = rp->nl, H = rp->nh, D = dim(c);
    if (strcmp(rp->layout, "page_first") == 0) { /* S T L H D */
        return (((s * PAGE + t) * L + l) * H + h) * D + e;
    }
    if (strcmp(rp->layout, "page_first_direct") == 0) { /* S L T H D */
        return (((s * L + l) * PAGE + t) * H + h) * D + e;
    }
    if (strcmp(rp->layout, "layer_first") == 0) { /* L S T H D */
        return (((l * S + s) * PAGE + t) * H + h) * D + e;
    }
    if (strcmp(rp->layout, "page_head") == 0) { /* S H T L D */
        return (((s * H + h) * PAGE + t) * L + l) * D + e;
    }
    fprintf(stderr, "no layout %s\n", rp->layout);
    abort();
}

/* fill puts page p's share into slot s. */
static void fill(rank_pool *rp, int64_t s, int p) {
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < PAGE; t++)
            for (int l = 0; l < rp->nl; l++)
                for (int h = 0; h < rp->nh; h++)
                    for (int e = 0; e < dim(c); e++)
                        rp->reg[c][at(rp, c, s, t, l, h, e)] = oracle(p, c, t, rp->l0 + l, rp->h0 + h, e);
}

/* verify checks every element of slot s: page p's share, or the sentinel
 * when p < 0 (a slot nothing was read into). It returns the mismatches and
 * prints the first. */
static int verify(const rank_pool *rp, int64_t s, int p, int line) {
    int bad = 0;
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < PAGE; t++)
            for (int l = 0; l < rp->nl; l++)
                for (int h = 0; h < rp->nh; h++)
                    for (int e = 0; e < dim(c); e++) {
                        uint32_t got = rp->reg[c][at(rp, c, s, t, l, h, e)];
                        uint32_t want = p < 0 ? SENTINEL : oracle(p, c, t, rp->l0 + l, rp->h0 + h, e);
                        if (got != want && bad++ == 0) {
                            fprintf(stderr,
                                    "kvreshard_test.c:%d: %s rank %d/%d slot %" PRId64 " page %d: "
                                    "component %d token %d layer %d head %d element %d is %08x, want %08x\n",
                                    line, rp->layout, rp->tp_rank, rp->pp_rank, s, p, c, t, rp->l0 + l,
                                    rp->h0 + h, e, got, want);
                        }
                    }
    if (bad) {
        failures++;
    }
    return bad;
}

/* ID is a handle's id, as messages name it. */
#define ID(h) ((uint64_t)(uintptr_t)(h))

static kvr_pool new_pool(const char *layout, int32_t nregions, void *const *bases, const uint64_t *sizes,
                         int64_t slots) {
    kvr_pool p = {.size = sizeof p, .layout = layout, .nregions = nregions, .bases = bases, .sizes = sizes,
                  .slots = slots};
    return p;
}

static kvr_pool pool_of(rank_pool *rp) { return new_pool(rp->layout, 2, rp->bases, rp->size, rp->slots); }

static kvr_placement placement_of(const rank_pool *rp) {
    kvr_placement p = {.size = sizeof p, .tp = rp->tp, .pp = rp->pp, .tp_rank = rp->tp_rank,
                       .pp_rank = rp->pp_rank, .pp_layers = rp->pp_layers};
    return p;
}

/* The model, with the kvreshard command's identity defaults, so that its
 * read finds these pages. */
static kvr_model new_model(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim, int32_t page,
                           const char *dtype, const char *name) {
    kvr_model m = {.size = sizeof m, .layers = layers, .kv_heads = kv_heads, .head_dim = head_dim,
                   .v_head_dim = v_head_dim, .page = page, .dtype = dtype, .name = name, .revision = "0",
                   .namespace_ = "kvreshard"};
    return m;
}

static kvr_model model(void) { return new_model(LAYERS, KV_HEADS, HEAD_DIM, V_HEAD_DIM, PAGE, "fp32", "model"); }

/* A batch of keys: one buffer and n + 1 offsets. */
typedef struct {
    char buf[4096];
    int64_t off[64];
    int64_t n;
} keys;

static void keys_add(keys *k, const char *key) {
    if (k->n == 0) {
        k->off[0] = 0;
    }
    size_t len = strlen(key);
    memcpy(k->buf + k->off[k->n], key, len);
    k->off[k->n + 1] = k->off[k->n] + (int64_t)len;
    k->n++;
}

/* page_key is the key of page p: the kvreshard command's synthetic token
 * hash, p times a large odd constant in hex. */
static void keys_add_page(keys *k, int p) {
    char s[32];
    snprintf(s, sizeof s, "%016" PRIx64, (uint64_t)((uint64_t)p * UINT64_C(0x9e3779b97f4a7c15)));
    keys_add(k, s);
}

static keys page_keys(int from, int to) {
    keys k = {0};
    for (int p = from; p < to; p++) {
        keys_add_page(&k, p);
    }
    return k;
}

static char err[512];

static kvr_writer *open_writer(kvr_store *st, rank_pool *rp, const char *part) {
    kvr_model m = model();
    kvr_placement pl = placement_of(rp);
    kvr_pool pool = pool_of(rp);
    kvr_writer *w = NULL;
    int rc = kvr_writer_open(st, &m, &pl, &pool, part, &w, err, sizeof err);
    CHECK(rc == KVR_OK && w != NULL, "writer_open %s rank %d/%d: %d %s", rp->layout, rp->tp_rank, rp->pp_rank, rc, err);
    return w;
}

static kvr_reader *open_reader(kvr_store *st, rank_pool *rp) {
    kvr_model m = model();
    kvr_placement pl = placement_of(rp);
    kvr_pool pool = pool_of(rp);
    kvr_reader *r = NULL;
    int rc = kvr_reader_open(st, &m, &pl, &pool, &r, err, sizeof err);
    CHECK(rc == KVR_OK && r != NULL, "reader_open %s rank %d/%d: %d %s", rp->layout, rp->tp_rank, rp->pp_rank, rc, err);
    return r;
}

/* write_pages writes pages [from, to), held at slot p, with writer w and
 * checks every status is want. */
static void write_pages(kvr_writer *w, int from, int to, uint8_t want) {
    keys k = page_keys(from, to);
    int64_t slots[64];
    uint8_t st[64];
    for (int p = from; p < to; p++) {
        slots[p - from] = p;
    }
    memset(st, 0xee, sizeof st);
    int rc = kvr_writer_write(w, k.buf, k.off, slots, k.n, st, err, sizeof err);
    CHECK(rc == KVR_OK, "writer_write: %d %s", rc, err);
    for (int i = 0; i < k.n; i++) {
        CHECK(st[i] == want, "page %d status %d, want %d (%s)", from + i, st[i], want, err);
    }
}

/* The pools of the three TP1/PP3 writer ranks: page p at slot p. */
static rank_pool writers[3];

/* The readers' PP split, not kvreshard's even one (4/3). */
static const int32_t reader_split[2] = {4, 3};

/* A page written by writer ranks 0 and 1 only: never complete. */
#define PARTIAL NPAGES

static void test_write(kvr_store *st) {
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

static void test_read(kvr_store *st) {
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

static void test_miss(kvr_store *st) {
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

static void test_domain(void) {
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

/* reader_fails opens a reader of a bad model, placement or pool and checks
 * the code and the exact message. */
static void reader_fails(kvr_store *st, kvr_model m, kvr_placement pl, kvr_pool pool, int want_rc, const char *want,
                         int line) {
    kvr_reader *r = NULL;
    int rc = kvr_reader_open(st, &m, &pl, &pool, &r, err, sizeof err);
    if (rc != want_rc || strcmp(err, want) != 0 || r != NULL) {
        failures++;
        fprintf(stderr, "kvreshard_test.c:%d: reader_open: %d %s\nwant %d %s\n", line, rc, err, want_rc, want);
    }
}

static void test_bad_arguments(kvr_store *st) {
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

static void test_closed(void) {
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

static void test_threads(kvr_store *st) {
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
static void test_fork(kvr_store *st) {
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

/* set_options sets the options of reader r (kvr_reader_set_options). */
static int set_options(kvr_reader *r, int32_t copy_workers, int64_t max_pages, int64_t max_bytes, int32_t check_parts,
                       char *e, size_t elen) {
    kvr_reader_options o = {.size = sizeof o, .copy_workers = copy_workers, .max_pages = max_pages,
                            .max_bytes = max_bytes, .check_parts = check_parts};
    return kvr_reader_set_options(r, &o, e, elen);
}

/* test_options sets a reader's copy workers and prefetch budget
 * (kvr_reader_set_options): bad values with their messages, the budget in
 * pages and in bytes, and back to no budget. */
static void test_options(kvr_store *st) {
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
static void test_big(kvr_store *st) {
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
                                    "kvreshard_test.c:%d: tp %d x cp %d (interleave %d) rank %d/%d slot %" PRId64
                                    " page %d: component %d local token %d (token %d) layer %d head %d element %d "
                                    "is %08x, want %08x\n",
                                    line, cp->tp, cp->cp, cp->il, cp->tp_rank, cp->cp_rank, s, p, c, j,
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
static void test_cp(kvr_store *st) {
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

static void test_max_procs(void) {
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

/* test_nul_keys: a key with a NUL byte is refused by every call that takes
 * keys, naming the key, before anything is written or read. */
static void test_nul_keys(void) {
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

/* bench times n empty reads (the cost of a call alone). */
static int bench(long n) {
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
static int readbench(const char *url, int pages, int rounds, int copy_workers) {
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
    if (e->stall_ms > 0) {
        struct timespec ts = {e->stall_ms / 1000, (long)(e->stall_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&e->mu);
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
static void test_engine_store(void) {
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

    /* Evict part 2 (PP rank 2's) of page 3: a miss at page 3, and its
     * commit and claim are gone; written again, it reads. */
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
    kvr_writer *w = open_writer(st, &writers[2], NULL);
    write_pages(w, 3, 4, KVR_WRITTEN);
    kvr_writer_close(w, err, sizeof err);
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
    the_engine.stall_ms = 1500;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK(rc == KVR_ESTORE && res.hit == 0 && res.stop == KVR_STOP_FAILED && strstr(err, "did not return within 200ms") != NULL,
          "stalled read: %d hit %" PRId64 " stop %d %s", rc, res.hit, res.stop, err);
    CHECK(t1.tv_sec - t0.tv_sec < 60, "the stalled read took %ld s", (long)(t1.tv_sec - t0.tv_sec));
    the_engine.stall_ms = 0;
    sleep(2); /* the stalled read returns */
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

/* Layouts defined at run time (kvr_define_layout): a model whose K and V
 * heads are alike, so that a pool with C inside L holds both in one
 * region. */
#define XL_LAYERS 4
#define XL_HEADS 2
#define XL_DIM 16
#define XL_PAGE 4
#define XL_PAGES 3

/* xl_oracle is element e of head h, layer l, token t of component c of
 * page p of the layouts test. */
static uint32_t xl_oracle(int p, int c, int t, int l, int h, int e) {
    uint64_t x = (((((uint64_t)p * 2 + c) * XL_PAGE + t) * XL_LAYERS + l) * XL_HEADS + h) * XL_DIM + e;
    x = (x + 3) * UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    return (uint32_t)x & 0x7fffffffu;
}

/* A rank's pool of the layouts test: page_first (two regions, S T L H D)
 * or vllm_host (one region, L C S T H D). */
typedef struct {
    int vllm; /* vllm_host, else page_first */
    int32_t tp, pp, tp_rank, pp_rank;
    const int32_t *split;
    int l0, nl, h0, nh;
    int64_t slots;
    int nreg;
    uint32_t *reg[2];
    uint64_t size[2];
    void *bases[2];
} xl_pool;

static void xl_init(xl_pool *x, int vllm, int tp, int pp, int tp_rank, int pp_rank, const int32_t *split,
                    int64_t slots) {
    memset(x, 0, sizeof *x);
    x->vllm = vllm, x->tp = tp, x->pp = pp, x->tp_rank = tp_rank, x->pp_rank = pp_rank, x->split = split;
    int lo = 0, n = 0;
    for (int s = 0; s <= pp_rank; s++) {
        lo += n;
        n = split ? split[s] : XL_LAYERS / pp + (s < XL_LAYERS % pp);
    }
    x->l0 = lo, x->nl = n, x->nh = XL_HEADS / tp, x->h0 = tp_rank * x->nh;
    x->slots = slots;
    x->nreg = vllm ? 1 : 2;
    uint64_t comp = (uint64_t)slots * XL_PAGE * x->nl * x->nh * XL_DIM * sizeof(uint32_t);
    for (int r = 0; r < x->nreg; r++) {
        x->size[r] = vllm ? 2 * comp : comp;
        x->reg[r] = malloc(x->size[r]);
        memset(x->reg[r], 0xff, x->size[r]);
        x->bases[r] = x->reg[r];
    }
}

static uint32_t *xl_at(xl_pool *x, int c, int64_t s, int t, int l, int h, int e) {
    size_t S = x->slots, L = x->nl, H = x->nh, D = XL_DIM, T = XL_PAGE;
    if (x->vllm) { /* L C S T H D */
        return &x->reg[0][(((((size_t)l * 2 + c) * S + s) * T + t) * H + h) * D + e];
    }
    return &x->reg[c][(((s * T + t) * L + l) * H + h) * D + e]; /* page_first: S T L H D */
}

/* xl_slot fills or verifies slot s as page p (p < 0: the sentinel). */
static int xl_slot(xl_pool *x, int64_t s, int p, int fill, int line) {
    int bad = 0;
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < XL_PAGE; t++)
            for (int l = 0; l < x->nl; l++)
                for (int h = 0; h < x->nh; h++)
                    for (int e = 0; e < XL_DIM; e++) {
                        uint32_t *at = xl_at(x, c, s, t, l, h, e);
                        uint32_t want = p < 0 ? SENTINEL : xl_oracle(p, c, t, x->l0 + l, x->h0 + h, e);
                        if (fill) {
                            *at = want;
                        } else if (*at != want && bad++ == 0) {
                            fprintf(stderr,
                                    "kvreshard_test.c:%d: %s rank %d/%d slot %" PRId64 " page %d: component %d "
                                    "token %d layer %d head %d element %d is %08x, want %08x\n",
                                    line, x->vllm ? "vllm_host" : "page_first", x->tp_rank, x->pp_rank, s, p, c, t,
                                    x->l0 + l, x->h0 + h, e, *at, want);
                        }
                    }
    if (bad) {
        failures++;
    }
    return bad;
}

static kvr_model xl_model(void) { return new_model(XL_LAYERS, XL_HEADS, XL_DIM, 0, XL_PAGE, "fp32", "xlmodel"); }

static kvr_placement xl_placement(const xl_pool *x) {
    kvr_placement p = {.size = sizeof p, .tp = x->tp, .pp = x->pp, .tp_rank = x->tp_rank, .pp_rank = x->pp_rank,
                       .pp_layers = x->split};
    return p;
}

static kvr_pool xl_kvr_pool(xl_pool *x) {
    return new_pool(x->vllm ? "vllm_host" : "page_first", x->nreg, x->bases, x->size, x->slots);
}

static keys xl_keys(const char *prefix) {
    keys k = {0};
    char s[32];
    for (int p = 0; p < XL_PAGES; p++) {
        snprintf(s, sizeof s, "%s%d", prefix, p);
        keys_add(&k, s);
    }
    return k;
}

/* The built-in layouts, as kvr_layouts lists them. */
static const char builtin_layouts[] = "part\tPLHD\tC T L H D\t\n"
                                      "part\tLPHD\tC L T H D\t\n"
                                      "part\tHPLD\tC H T L D\t\n"
                                      "pool\tpage_first\tC S T L H D\tPLHD\n"
                                      "pool\tpage_first_direct\tC S L T H D\tLPHD\n"
                                      "pool\tlayer_first\tC L S T H D\tLPHD\n"
                                      "pool\tpage_head\tC S H T L D\tHPLD\n";

/* test_layouts lists the layouts, refuses bad declarations with kvlc's
 * messages, defines the part layout cxblock (vLLM's x-blocked key cache,
 * C L H D/8 T D%8) and the pool layout vllm_host (L C S T H D, of
 * examples/customlayout), and moves pages through them on the
 * interpreter: TP 2 x PP 2 page_first writers store them in cxblock,
 * TP 1 x PP 2 vllm_host readers read them; a vllm_host writer stores pages
 * a TP 2 page_first reader reads. Every element is checked. */
static void test_layouts(kvr_store *st) {
    char text[4096];
    size_t need = 0;
    int rc = kvr_layouts(NULL, 0, &need, err, sizeof err);
    CHECK(rc == KVR_OK && need == sizeof builtin_layouts, "kvr_layouts need: %d %zu %s", rc, need, err);
    rc = kvr_layouts(text, sizeof text, &need, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    CHECK(strcmp(text, builtin_layouts) == 0, "kvr_layouts:\n%s", text);
    char want[512];
    snprintf(want, sizeof want, "out has 10 bytes; the layouts take %zu", sizeof builtin_layouts);
    rc = kvr_layouts(text, 10, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    CHECK(text[0] == 0, "a refused kvr_layouts wrote %s", text);
    rc = kvr_layouts(NULL, 0, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "out is NULL with outlen 0");

    /* Declarations refused, with kvlc's words. */
    rc = kvr_define_layout("part", "x", "C T T H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "layout \"x\": order \"C T T H D\": column 5: axis T appears twice in layout x, first at 1:3 (and 1 "
              "more error)");
    rc = kvr_define_layout("part", "x", "C S T L H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "layout \"x\": order \"C S T L H D\": column 3: part layout x has a slot axis S; only pool layouts "
              "have one");
    rc = kvr_define_layout("tile", "x", "C T L H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "layout \"x\": order \"C T L H D\": unknown layout kind \"tile\"; kinds are part and pool");
    rc = kvr_define_layout("part", NULL, "C T L H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "kind, name or order is NULL");
    rc = kvr_define_layout("part", "PLHD", "C L T H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "layout \"PLHD\" is already part(C T L H D) (builtin.kvl:5:1); defined at run time declares it "
              "part(C L T H D)");
    rc = kvr_define_layout("pool", "x", "C S T L H D", "nope", err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "layout \"x\": writes \"nope\", which is not a registered part layout (PLHD, LPHD, HPLD)");
    rc = kvr_define_layout("pool", "x", "C S T L H D", "page_first", err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "layout \"x\": writes page_first, a pool layout; a pool writes a part layout (PLHD, LPHD, HPLD)");
    /* A built-in declared again as it is: nothing changes. */
    rc = kvr_define_layout("part", "PLHD", "C  T L H D", "", err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");

    rc = kvr_define_layout("part", "cxblock", "C L H D/8 T D%8", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    rc = kvr_define_layout("pool", "vllm_host", "L C S T H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    rc = kvr_define_layout("pool", "vllm_host", "L C S T H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, ""); /* the same declaration twice */
    rc = kvr_define_layout("pool", "vllm_host", "C L S T H D", NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err,
              "layout \"vllm_host\" is already pool(L C S T H D) (defined at run time); defined at run time "
              "declares it pool(C L S T H D)");
    rc = kvr_layouts(text, sizeof text, &need, err, sizeof err);
    snprintf(want, sizeof want, "%spart\tcxblock\tC L H D/8 T D%%8\t\npool\tvllm_host\tL C S T H D\t\n",
             builtin_layouts);
    CHECK(rc == KVR_OK && strcmp(text, want) == 0 && need == strlen(want) + 1, "kvr_layouts after defining:\n%s",
          text);

    /* page_first writers of TP 2 x PP 2, in cxblock. */
    kvr_model m = xl_model();
    keys k = xl_keys("xl");
    int64_t slots[XL_PAGES] = {2, 0, 1};
    for (int r = 0; r < 4; r++) {
        xl_pool x;
        xl_init(&x, 0, 2, 2, r % 2, r / 2, NULL, XL_PAGES);
        for (int p = 0; p < XL_PAGES; p++) {
            xl_slot(&x, slots[p], p, 1, __LINE__);
        }
        kvr_placement pl = xl_placement(&x);
        kvr_pool pool = xl_kvr_pool(&x);
        kvr_writer *w = NULL;
        rc = kvr_writer_open(st, &m, &pl, &pool, "cxblock", &w, err, sizeof err);
        CHECK_MSG(rc, KVR_OK, err, "");
        uint8_t status[XL_PAGES];
        rc = kvr_writer_write(w, k.buf, k.off, slots, k.n, status, err, sizeof err);
        CHECK(rc == KVR_OK && status[0] == KVR_WRITTEN && status[2] == KVR_WRITTEN, "cxblock write: %d %s", rc, err);
        kvr_writer_close(w, err, sizeof err);
        free(x.reg[0]), free(x.reg[1]);
    }
    /* vllm_host readers of TP 1 x PP 2 (split 1/3). */
    static const int32_t split[2] = {1, 3};
    int64_t rslots[XL_PAGES] = {0, 3, 1};
    for (int pp = 0; pp < 2; pp++) {
        xl_pool x;
        xl_init(&x, 1, 1, 2, 0, pp, split, 4);
        kvr_placement pl = xl_placement(&x);
        kvr_pool pool = xl_kvr_pool(&x);
        kvr_reader *r = NULL;
        rc = kvr_reader_open(st, &m, &pl, &pool, &r, err, sizeof err);
        CHECK_MSG(rc, KVR_OK, err, "");
        kvr_read_result res = {.size = sizeof res};
        rc = kvr_reader_read(r, k.buf, k.off, rslots, k.n, &res, err, sizeof err);
        CHECK(rc == KVR_OK && res.hit == XL_PAGES && res.stop == KVR_STOP_NONE, "vllm_host read: %d hit %" PRId64 " %s",
              rc, res.hit, err);
        for (int64_t s = 0; s < x.slots; s++) {
            xl_slot(&x, s, s == 0 ? 0 : s == 3 ? 1 : s == 1 ? 2 : -1, 0, __LINE__);
        }
        kvr_reader_stats rs = {.size = sizeof rs};
        rc = kvr_reader_stats_get(r, &rs, err, sizeof err);
        CHECK(rc == KVR_OK && rs.fallbacks > 0, "vllm_host reads planned %" PRId64 " on the interpreter", rs.fallbacks);

        /* A vllm_host pool names no part layout: its writer names one. */
        kvr_writer *w = NULL;
        rc = kvr_writer_open(st, &m, &pl, &pool, NULL, &w, err, sizeof err);
        CHECK_MSG(rc, KVR_EINVAL, err,
                  "writer: pool layout vllm_host names no part layout to write (writes); name one (PLHD, LPHD, HPLD, "
                  "cxblock)");
        kvr_reader_close(r, err, sizeof err);
        /* The vllm_host ranks write pages of their own in cxblock. */
        keys v = xl_keys("vh");
        rc = kvr_writer_open(st, &m, &pl, &pool, "cxblock", &w, err, sizeof err);
        CHECK_MSG(rc, KVR_OK, err, "");
        for (int p = 0; p < XL_PAGES; p++) {
            xl_slot(&x, p, XL_PAGES + p, 1, __LINE__);
        }
        int64_t wslots[XL_PAGES] = {0, 1, 2};
        uint8_t status[XL_PAGES];
        rc = kvr_writer_write(w, v.buf, v.off, wslots, v.n, status, err, sizeof err);
        CHECK(rc == KVR_OK && status[0] == KVR_WRITTEN && status[2] == KVR_WRITTEN, "vllm_host write: %d %s", rc,
              err);
        kvr_writer_close(w, err, sizeof err);
        free(x.reg[0]);
    }
    /* ... read by a page_first rank of TP 2. */
    keys v = xl_keys("vh");
    xl_pool x;
    xl_init(&x, 0, 2, 1, 1, 0, NULL, XL_PAGES);
    kvr_placement pl = xl_placement(&x);
    kvr_pool pool = xl_kvr_pool(&x);
    kvr_reader *r = NULL;
    rc = kvr_reader_open(st, &m, &pl, &pool, &r, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    kvr_read_result res = {.size = sizeof res};
    int64_t pslots[XL_PAGES] = {1, 2, 0};
    rc = kvr_reader_read(r, v.buf, v.off, pslots, v.n, &res, err, sizeof err);
    CHECK(rc == KVR_OK && res.hit == XL_PAGES, "page_first read of vllm_host pages: %d hit %" PRId64 " %s", rc,
          res.hit, err);
    for (int p = 0; p < XL_PAGES; p++) {
        xl_slot(&x, pslots[p], XL_PAGES + p, 0, __LINE__);
    }
    kvr_reader_close(r, err, sizeof err);
    free(x.reg[0]), free(x.reg[1]);
}

/* test_abi: the versions, the codes' descriptions, and the sizes of the
 * growing structs: too small, past what the library knows (0, or a field
 * of a newer header it cannot honour), and outputs of a newer header's
 * size, whose unknown bytes get 0. */
static void test_abi(kvr_store *st) {
    int32_t minor = -1;
    CHECK(kvr_version(&minor) == KVR_ABI_VERSION && minor == KVR_ABI_MINOR, "library version %d.%d, header %d.%d",
          kvr_version(NULL), minor, KVR_ABI_VERSION, KVR_ABI_MINOR);
    static const char *const desc[] = {"success", "invalid argument", "store failed", "manifest rejected",
                                       "closed or unknown handle",
                                       "called in a forked child of the process that loaded the library",
                                       "internal error in the library"};
    for (int c = KVR_OK; c <= KVR_EINTERNAL; c++) {
        CHECK(strcmp(kvr_errstr(c), desc[c]) == 0, "kvr_errstr(%d) is %s", c, kvr_errstr(c));
    }
    CHECK(strcmp(kvr_errstr(-1), "unknown code") == 0 && strcmp(kvr_errstr(KVR_EINTERNAL + 1), "unknown code") == 0,
          "kvr_errstr of an unknown code: %s", kvr_errstr(-1));

    rank_pool rp;
    pool_init(&rp, "page_first", 1, 1, 0, 0, NULL, 2);
    kvr_model m = model();
    kvr_placement pl = placement_of(&rp);
    kvr_pool pool = pool_of(&rp);
    char want[256];
    kvr_model bad = m;
    bad.size = 4;
    snprintf(want, sizeof want,
             "kvr_model.size is 4; this library's kvr_model has %zu bytes: set size to sizeof(kvr_model)",
             sizeof(kvr_model));
    reader_fails(st, bad, pl, pool, KVR_EINVAL, want, __LINE__);
    char domain[65];
    int rc = kvr_model_domain(&bad, domain, sizeof domain, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    kvr_placement badp = pl;
    badp.size = 0;
    snprintf(want, sizeof want,
             "kvr_placement.size is 0; this library's kvr_placement has %zu bytes: set size to "
             "sizeof(kvr_placement)",
             sizeof(kvr_placement));
    reader_fails(st, m, badp, pool, KVR_EINVAL, want, __LINE__);
    kvr_pool badpool = pool;
    badpool.size = 5000;
    reader_fails(st, m, pl, badpool, KVR_EINVAL, "kvr_pool.size is 5000, more than 4096", __LINE__);

    /* A newer header's kvr_model: its field set is refused, 0 is read as
     * this library's model. */
    struct {
        kvr_model m;
        int32_t newer;
    } grown;
    memset(&grown, 0, sizeof grown);
    grown.m = m;
    grown.m.size = sizeof grown;
    grown.newer = 3;
    kvr_reader *r = NULL;
    rc = kvr_reader_open(st, &grown.m, &pl, &pool, &r, err, sizeof err);
    snprintf(want, sizeof want, "kvr_model byte %zu is 3: a field this library (ABI 2.1) does not know is set",
             sizeof(kvr_model));
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    grown.newer = 0;
    rc = kvr_reader_open(st, &grown.m, &pl, &pool, &r, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");

    /* Outputs: too small is refused before the read; a newer header's
     * bytes get 0, and size is never written. */
    keys k = page_keys(0, 2);
    int64_t slots[2] = {0, 1};
    kvr_read_result res;
    memset(&res, 0xee, sizeof res);
    res.size = 8;
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &res, err, sizeof err);
    snprintf(want, sizeof want,
             "kvr_read_result.size is 8; this library's kvr_read_result has %zu bytes: set size to "
             "sizeof(kvr_read_result)",
             sizeof(kvr_read_result));
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    CHECK(res.hit == (int64_t)0xeeeeeeeeeeeeeeeeu && res.size == 8, "a refused read wrote *res");
    struct {
        kvr_read_result r;
        int64_t newer;
    } gres;
    memset(&gres, 0xee, sizeof gres);
    gres.r.size = sizeof gres;
    rc = kvr_reader_read(r, k.buf, k.off, slots, k.n, &gres.r, err, sizeof err);
    CHECK(rc == KVR_OK && gres.r.hit == 0 && gres.r.stop == KVR_STOP_MISS && gres.newer == 0 &&
              gres.r.size == sizeof gres,
          "read into a newer kvr_read_result: %d hit %" PRId64 " newer %" PRId64 " size %u", rc, gres.r.hit,
          gres.newer, gres.r.size);
    struct {
        kvr_reader_stats s;
        int64_t newer[3];
    } gstats;
    memset(&gstats, 0xee, sizeof gstats);
    gstats.s.size = sizeof gstats;
    rc = kvr_reader_stats_get(r, &gstats.s, err, sizeof err);
    CHECK(rc == KVR_OK && gstats.s.requests == 1 && gstats.s.misses == 2 && gstats.newer[0] == 0 &&
              gstats.newer[2] == 0 && gstats.s.size == sizeof gstats,
          "newer kvr_reader_stats: %d %" PRId64 " requests", rc, gstats.s.requests);
    kvr_reader_stats rs = {.size = 0};
    rc = kvr_reader_stats_get(r, &rs, err, sizeof err);
    snprintf(want, sizeof want,
             "kvr_reader_stats.size is 0; this library's kvr_reader_stats has %zu bytes: set size to "
             "sizeof(kvr_reader_stats)",
             sizeof(kvr_reader_stats));
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    rc = kvr_reader_stats_get(r, NULL, err, sizeof err);
    CHECK_MSG(rc, KVR_EINVAL, err, "out is NULL");
    kvr_writer *w = open_writer(st, &rp, NULL);
    kvr_writer_stats ws = {.size = sizeof ws - 1};
    rc = kvr_writer_stats_get(w, &ws, err, sizeof err);
    snprintf(want, sizeof want,
             "kvr_writer_stats.size is %zu; this library's kvr_writer_stats has %zu bytes: set size to "
             "sizeof(kvr_writer_stats)",
             sizeof ws - 1, sizeof ws);
    CHECK_MSG(rc, KVR_EINVAL, err, want);
    CHECK_MSG(kvr_writer_close(w, err, sizeof err), KVR_OK, err, "");
    CHECK_MSG(kvr_reader_close(r, err, sizeof err), KVR_OK, err, "");
    pool_free(&rp);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "bench") == 0) {
        return bench(atol(argv[2]));
    }
    if ((argc == 5 || argc == 6) && strcmp(argv[1], "readbench") == 0) {
        return readbench(argv[2], atoi(argv[3]), atoi(argv[4]), argc == 6 ? atoi(argv[5]) : 0);
    }
    if (argc != 2) {
        fprintf(stderr, "usage: kvreshard_test DIR | kvreshard_test bench N | "
                        "kvreshard_test readbench URL PAGES ROUNDS [COPY_WORKERS]\n");
        return 2;
    }
    char url[4200];
    snprintf(url, sizeof url, "file://%s", argv[1]);
    kvr_store *st = NULL;
    int rc = kvr_store_open(url, &st, err, sizeof err);
    CHECK(rc == KVR_OK && st != NULL, "store_open %s: %d %s", url, rc, err);
    if (rc != KVR_OK) {
        return 1;
    }
    test_abi(st);
    test_domain();
    test_write(st);
    test_read(st);
    test_miss(st);
    test_bad_arguments(st);
    test_nul_keys();
    test_closed();
    test_threads(st);
    test_options(st);
    test_big(st);
    test_cp(st);
    test_fork(st);
    test_max_procs();
    test_layouts(st);
    rc = kvr_store_close(st, err, sizeof err);
    CHECK_MSG(rc, KVR_OK, err, "");
    for (int r = 0; r < 3; r++) {
        pool_free(&writers[r]);
    }
    test_engine_store();
    for (int r = 0; r < 3; r++) {
        pool_free(&writers[r]);
    }
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
