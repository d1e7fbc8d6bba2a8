/*
 * kvr_test.h: what the files of the C test program share (kvreshard_test.c,
 * its main, and the kvr_test_*.c files by topic): the model of the tests,
 * the check macros, the ranks' pools laid out by the tests (not the
 * library), batches of keys, the helpers of kvr_test_pools.c, and the
 * tests main runs. Failures are printed with the file and line of the
 * check.
 */
#ifndef KVR_TEST_H
#define KVR_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* failures counts the failed checks; main reports them. */
extern int failures;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        if (!(cond)) {                                                           \
            failures++;                                                          \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
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

/* ID is a handle's id, as messages name it. */
#define ID(h) ((uint64_t)(uintptr_t)(h))

/* rank_pool is one rank's pool, laid out by the test program, not the library. */
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

/* A batch of keys: one buffer and n + 1 offsets. */
typedef struct {
    char buf[4096];
    int64_t off[64];
    int64_t n;
} keys;

/* err is the message buffer of the calls that do not bring their own. */
extern char err[512];

/* The pools of the three TP1/PP3 writer ranks (test_write): page p at
 * slot p. */
extern rank_pool writers[3];

/* The readers' PP split, not kvreshard's even one (4/3). */
extern const int32_t reader_split[2];

/* The helpers (kvr_test_pools.c). */
uint32_t oracle(int p, int c, int t, int l, int h, int e);
void pool_init(rank_pool *rp, const char *layout, int tp, int pp, int tp_rank, int pp_rank, const int32_t *pp_layers,
               int64_t slots);
void pool_free(rank_pool *rp);
void fill(rank_pool *rp, int64_t s, int p);
int verify_at(const rank_pool *rp, int64_t s, int p, const char *file, int line);
kvr_pool new_pool(const char *layout, int32_t nregions, void *const *bases, const uint64_t *sizes, int64_t slots);
kvr_pool pool_of(rank_pool *rp);
kvr_placement placement_of(const rank_pool *rp);
kvr_model new_model(int32_t layers, int32_t kv_heads, int32_t head_dim, int32_t v_head_dim, int32_t page,
                    const char *dtype, const char *name);
kvr_model model(void);
void keys_add(keys *k, const char *key);
void keys_add_page(keys *k, int p);
keys page_keys(int from, int to);
kvr_writer *open_writer(kvr_store *st, rank_pool *rp, const char *part);
kvr_reader *open_reader(kvr_store *st, rank_pool *rp);
void write_pages(kvr_writer *w, int from, int to, uint8_t want);
void reader_fails_at(kvr_store *st, kvr_model m, kvr_placement pl, kvr_pool pool, int want_rc, const char *want,
                     const char *file, int line);
int set_options(kvr_reader *r, int32_t copy_workers, int64_t max_pages, int64_t max_bytes, int32_t check_parts,
                char *e, size_t elen);

/* verify and reader_fails name the caller's file with the line it gives. */
#define verify(rp, s, p, line) verify_at((rp), (s), (p), __FILE__, (line))
#define reader_fails(st, m, pl, pool, want_rc, want, line) \
    reader_fails_at((st), (m), (pl), (pool), (want_rc), (want), __FILE__, (line))

/* The tests, in the order main runs them, by file. */
void test_abi(kvr_store *st);            /* kvr_test_layouts.c */
void test_domain(void);                  /* kvr_test_inputs.c */
void test_write(kvr_store *st);          /* kvr_test_rw.c */
void test_read(kvr_store *st);           /* kvr_test_rw.c */
void test_miss(kvr_store *st);           /* kvr_test_rw.c */
void test_bad_arguments(kvr_store *st);  /* kvr_test_inputs.c */
void test_nul_keys(void);                /* kvr_test_inputs.c */
void test_closed(void);                  /* kvr_test_inputs.c */
void test_threads(kvr_store *st);        /* kvr_test_threads.c */
void test_options(kvr_store *st);        /* kvr_test_rw.c */
void test_big(kvr_store *st);            /* kvr_test_threads.c */
void test_cp(kvr_store *st);             /* kvr_test_cp.c */
void test_fork(kvr_store *st);           /* kvr_test_threads.c */
void test_max_procs(void);               /* kvr_test_threads.c */
void test_layouts(kvr_store *st);        /* kvr_test_layouts.c */
void test_engine_store(void);            /* kvr_test_engine.c */

/* The commands besides the tests (kvr_test_bench.c). */
int bench(long n);
int readbench(const char *url, int pages, int rounds, int copy_workers);

#endif
