/*
 * kvr_test_layouts.c: layouts defined at run time (kvr_layouts,
 * kvr_define_layout) moving pages between page_first and vllm_host pools,
 * and the ABI: versions, the codes' descriptions, and the sizes of the
 * growing structs.
 */
#include "kvr_test.h"

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
                                    "%s:%d: %s rank %d/%d slot %" PRId64 " page %d: component %d "
                                    "token %d layer %d head %d element %d is %08x, want %08x\n",
                                    __FILE__, line, x->vllm ? "vllm_host" : "page_first", x->tp_rank, x->pp_rank,
                                    s, p, c, t, x->l0 + l, x->h0 + h, e, *at, want);
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
void test_layouts(kvr_store *st) {
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
              "layout \"x\": order \"C T T H D\": layout x is missing axis L; column 5: axis T appears twice in "
              "layout x, first at 1:3");
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
/* END_IS_SIZE: the last field of a growing struct ends where the struct
 * does, so that no padding lies where a later minor would put a field
 * that this library could not tell from padding. */
#define END_IS_SIZE(T, last) ((offsetof(T, last) + sizeof(((T *)0)->last)) == sizeof(T))
_Static_assert(END_IS_SIZE(kvr_model, fingerprint), "kvr_model ends in padding");
_Static_assert(END_IS_SIZE(kvr_placement, pp_layers), "kvr_placement ends in padding");
_Static_assert(END_IS_SIZE(kvr_pool, slots), "kvr_pool ends in padding");
_Static_assert(END_IS_SIZE(kvr_reader_options, reserved), "kvr_reader_options ends in padding");
_Static_assert(END_IS_SIZE(kvr_engine, lease_ms), "kvr_engine ends in padding");
_Static_assert(END_IS_SIZE(kvr_read_result, ops), "kvr_read_result ends in padding");
_Static_assert(END_IS_SIZE(kvr_reader_stats, checksum_errors), "kvr_reader_stats ends in padding");
_Static_assert(END_IS_SIZE(kvr_writer_stats, bytes), "kvr_writer_stats ends in padding");

void test_abi(kvr_store *st) {
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
