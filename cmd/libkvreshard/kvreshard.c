// The public functions of kvreshard.h: each checks that it does not run in
// a forked child of the process that loaded the library and only then calls
// its Go export.
//
// The check is in C, at the top of every function, because a forked child
// has only the thread that called fork: entering Go there waits for threads
// that no longer exist (a call that schedules a goroutine hangs for good).
// A pthread_atfork handler marks the child, so that the check costs a load
// instead of a getpid() system call on every call (about half a
// microsecond in a virtual machine); the pids recorded at load and in the
// child name both processes in the message.
//
// The package compiles with -fvisibility=hidden, so the library exports
// only the functions declared in kvreshard.h, not the Go exports below.

#include <pthread.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#pragma GCC visibility push(default)
#include "kvreshard.h"
#pragma GCC visibility pop

#include "_cgo_export.h"

static pid_t kvr_load_pid;          // the process that loaded the library
static volatile pid_t kvr_fork_pid; // set in a forked child: its pid

static void kvr_mark_child(void) { kvr_fork_pid = getpid(); }

__attribute__((constructor)) static void kvr_init(void) {
    kvr_load_pid = getpid();
    pthread_atfork(NULL, NULL, kvr_mark_child);
}

// kvr_forked reports whether this is a forked child of the process that
// loaded the library, and then says so in err.
static int kvr_forked(char *err, size_t errlen) {
    pid_t pid = kvr_fork_pid;
    if (pid == 0) {
        return 0;
    }
    if (err != NULL && errlen > 0) {
        snprintf(err, errlen,
                 "called in process %ld, a forked child of process %ld that loaded libkvreshard: "
                 "Go does not survive fork; load the library in a process started by spawn or exec",
                 (long)pid, (long)kvr_load_pid);
    }
    return 1;
}

int kvr_version(void) { return KVR_ABI_VERSION; }

int kvr_set_max_procs(int32_t n, int32_t *prev) {
    if (kvr_forked(NULL, 0)) {
        return KVR_EFORK;
    }
    return kvrgoSetMaxProcs(n, prev);
}

int kvr_model_domain(const kvr_model *m, char *out, size_t outlen, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoModelDomain((kvr_model *)m, out, outlen, err, errlen);
}

int kvr_store_open(const char *url, uint64_t *store, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoStoreOpen((char *)url, store, err, errlen);
}

int kvr_store_open_engine(const kvr_engine *e, const char *name, uint64_t *store, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoStoreOpenEngine((kvr_engine *)e, (char *)name, store, err, errlen);
}

int kvr_store_close(uint64_t store, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoStoreClose(store, err, errlen);
}

int kvr_writer_open(uint64_t store, const kvr_model *m, const kvr_placement *p, const kvr_pool *pool,
                    const char *part_layout, uint64_t *writer, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterOpen(store, (kvr_model *)m, (kvr_placement *)p, (kvr_pool *)pool, (char *)part_layout,
                           writer, err, errlen);
}

int kvr_writer_publish(uint64_t writer, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterPublish(writer, err, errlen);
}

int kvr_writer_write(uint64_t writer, const char *keys, const int64_t *offsets, const int64_t *slots,
                     int64_t n, uint8_t *statuses, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterWrite(writer, (char *)keys, (int64_t *)offsets, (int64_t *)slots, n, statuses, err,
                            errlen);
}

int kvr_writer_close(uint64_t writer, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterClose(writer, err, errlen);
}

int kvr_reader_open(uint64_t store, const kvr_model *m, const kvr_placement *p, const kvr_pool *pool,
                    uint64_t *reader, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderOpen(store, (kvr_model *)m, (kvr_placement *)p, (kvr_pool *)pool, reader, err, errlen);
}

int kvr_reader_exists(uint64_t reader, const char *keys, const int64_t *offsets, int64_t n,
                      int64_t *complete, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderExists(reader, (char *)keys, (int64_t *)offsets, n, complete, err, errlen);
}

int kvr_reader_read(uint64_t reader, const char *keys, const int64_t *offsets, const int64_t *slots,
                    int64_t n, kvr_read_result *res, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderRead(reader, (char *)keys, (int64_t *)offsets, (int64_t *)slots, n, res, err, errlen);
}

int kvr_reader_set_options(uint64_t reader, const kvr_reader_options *opts, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderSetOptions(reader, (kvr_reader_options *)opts, err, errlen);
}

int kvr_reader_stats_get(uint64_t reader, kvr_reader_stats *out) {
    if (kvr_forked(NULL, 0)) {
        return KVR_EFORK;
    }
    return kvrgoReaderStats(reader, out);
}

int kvr_writer_stats_get(uint64_t writer, kvr_writer_stats *out) {
    if (kvr_forked(NULL, 0)) {
        return KVR_EFORK;
    }
    return kvrgoWriterStats(writer, out);
}

int kvr_reader_close(uint64_t reader, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderClose(reader, err, errlen);
}
