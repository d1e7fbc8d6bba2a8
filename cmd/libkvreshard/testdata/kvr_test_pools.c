/*
 * kvr_test_pools.c: the helpers of the C test program (kvr_test.h): the
 * oracle, the ranks' pools and their checks, the library's structs for
 * them, batches of keys, writers and readers opened on them, and the
 * program's shared state (the failures, the message buffer, the writer
 * ranks' pools).
 */
#include "kvr_test.h"

int failures;

/* oracle is the content of element e of head h, layer l, token t of
 * component c (0 K, 1 V) of page p: a mix of the logical index, never the
 * sentinel. */
uint32_t oracle(int p, int c, int t, int l, int h, int e) {
    uint64_t x = (((((uint64_t)p * 2 + c) * PAGE + t) * LAYERS + l) * KV_HEADS + h) * HEAD_DIM + e;
    x = (x + 1) * UINT64_C(0x9e3779b97f4a7c15);
    x ^= x >> 31;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 29;
    return (uint32_t)x & 0x7fffffffu;
}

static int dim(int c) { return c == 0 ? HEAD_DIM : V_HEAD_DIM; }

void pool_init(rank_pool *rp, const char *layout, int tp, int pp, int tp_rank, int pp_rank,
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

void pool_free(rank_pool *rp) {
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
void fill(rank_pool *rp, int64_t s, int p) {
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < PAGE; t++)
            for (int l = 0; l < rp->nl; l++)
                for (int h = 0; h < rp->nh; h++)
                    for (int e = 0; e < dim(c); e++)
                        rp->reg[c][at(rp, c, s, t, l, h, e)] = oracle(p, c, t, rp->l0 + l, rp->h0 + h, e);
}

/* verify_at (verify) checks every element of slot s: page p's share, or the sentinel
 * when p < 0 (a slot nothing was read into). It returns the mismatches and
 * prints the first. */
int verify_at(const rank_pool *rp, int64_t s, int p, const char *file, int line) {
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
                                    "%s:%d: %s rank %d/%d slot %" PRId64 " page %d: "
                                    "component %d token %d layer %d head %d element %d is %08x, want %08x\n",
                                    file, line, rp->layout, rp->tp_rank, rp->pp_rank, s, p, c, t, rp->l0 + l,
                                    rp->h0 + h, e, got, want);
                        }
                    }
    if (bad) {
        failures++;
    }
    return bad;
}

kvr_pool new_pool(const char *layout, int32_t nregions, void *const *bases, const uint64_t *sizes,
                  int64_t slots) {
    kvr_pool p = {.size = sizeof p, .layout = layout, .nregions = nregions, .bases = bases, .sizes = sizes,
                  .slots = slots};
    return p;
}

kvr_pool pool_of(rank_pool *rp) { return new_pool(rp->layout, 2, rp->bases, rp->size, rp->slots); }

kvr_placement placement_of(const rank_pool *rp) {
    kvr_placement p = {.size = sizeof p, .tp = rp->tp, .pp = rp->pp, .tp_rank = rp->tp_rank,
                       .pp_rank = rp->pp_rank, .pp_layers = rp->pp_layers};
    return p;
}

/* The model, with the kvreshard command's identity defaults, so that its
 * read finds these pages. */
kvr_model new_model(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim, int32_t page,
                    const char *dtype, const char *name) {
    kvr_model m = {.size = sizeof m, .layers = layers, .kv_heads = kv_heads, .head_dim = head_dim,
                   .v_head_dim = v_head_dim, .page = page, .dtype = dtype, .name = name, .revision = "0",
                   .namespace_ = "kvreshard"};
    return m;
}

kvr_model model(void) { return new_model(LAYERS, KV_HEADS, HEAD_DIM, V_HEAD_DIM, PAGE, "fp32", "model"); }

void keys_add(keys *k, const char *key) {
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
void keys_add_page(keys *k, int p) {
    char s[32];
    snprintf(s, sizeof s, "%016" PRIx64, (uint64_t)((uint64_t)p * UINT64_C(0x9e3779b97f4a7c15)));
    keys_add(k, s);
}

keys page_keys(int from, int to) {
    keys k = {0};
    for (int p = from; p < to; p++) {
        keys_add_page(&k, p);
    }
    return k;
}

char err[512];

kvr_writer *open_writer(kvr_store *st, rank_pool *rp, const char *part) {
    kvr_model m = model();
    kvr_placement pl = placement_of(rp);
    kvr_pool pool = pool_of(rp);
    kvr_writer *w = NULL;
    int rc = kvr_writer_open(st, &m, &pl, &pool, part, &w, err, sizeof err);
    CHECK(rc == KVR_OK && w != NULL, "writer_open %s rank %d/%d: %d %s", rp->layout, rp->tp_rank, rp->pp_rank, rc, err);
    return w;
}

kvr_reader *open_reader(kvr_store *st, rank_pool *rp) {
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
void write_pages(kvr_writer *w, int from, int to, uint8_t want) {
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
rank_pool writers[3];

/* The readers' PP split, not kvreshard's even one (4/3). */
const int32_t reader_split[2] = {4, 3};

/* reader_fails_at (reader_fails) opens a reader of a bad model, placement or pool and checks
 * the code and the exact message. */
void reader_fails_at(kvr_store *st, kvr_model m, kvr_placement pl, kvr_pool pool, int want_rc, const char *want,
                     const char *file, int line) {
    kvr_reader *r = NULL;
    int rc = kvr_reader_open(st, &m, &pl, &pool, &r, err, sizeof err);
    if (rc != want_rc || strcmp(err, want) != 0 || r != NULL) {
        failures++;
        fprintf(stderr, "%s:%d: reader_open: %d %s\nwant %d %s\n", file, line, rc, err, want_rc, want);
    }
}

/* set_options sets the options of reader r (kvr_reader_set_options). */
int set_options(kvr_reader *r, int32_t copy_workers, int64_t max_pages, int64_t max_bytes, int32_t check_parts,
                char *e, size_t elen) {
    kvr_reader_options o = {.size = sizeof o, .copy_workers = copy_workers, .max_pages = max_pages,
                            .max_bytes = max_bytes, .check_parts = check_parts};
    return kvr_reader_set_options(r, &o, e, elen);
}
