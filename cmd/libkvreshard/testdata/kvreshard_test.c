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
 * its file and line and the exit status is 1.
 *
 * This file is the program's main. The tests live in files by topic, none
 * over 800 lines, and clib_test.go compiles every .c file of testdata
 * into the program: kvr_test.h declares what they share; kvr_test_pools.c
 * holds the oracle, the ranks' pools and the helpers; kvr_test_rw.c
 * writes, reads, misses and reader options; kvr_test_inputs.c bad
 * arguments, closed handles, NUL keys and domains; kvr_test_threads.c
 * threads, fork, the big model and kvr_set_max_procs; kvr_test_cp.c
 * context parallelism; kvr_test_engine.c the object engine (kvr_engine);
 * kvr_test_layouts.c layouts and the ABI; kvr_test_bench.c the bench and
 * readbench commands.
 */
#include "kvr_test.h"

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
