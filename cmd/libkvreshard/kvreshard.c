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
// Handles cross into Go as the ids they hold (handle_id); Go's exports take
// and return uint64_t ids, never the opaque pointer types, so that Go never
// holds a value of a pointer type that points nowhere.
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

// handle_id is the id a handle holds (0 for NULL).
static uint64_t handle_id(const void *h) { return (uint64_t)(uintptr_t)h; }

int kvr_version(int32_t *minor) {
    if (minor != NULL) {
        *minor = KVR_ABI_MINOR;
    }
    return KVR_ABI_VERSION;
}

const char *kvr_errstr(int code) {
    switch (code) {
    case KVR_OK:
        return "success";
    case KVR_EINVAL:
        return "invalid argument";
    case KVR_ESTORE:
        return "store failed";
    case KVR_EMANIFEST:
        return "manifest rejected";
    case KVR_ECLOSED:
        return "closed or unknown handle";
    case KVR_EFORK:
        return "called in a forked child of the process that loaded the library";
    case KVR_EINTERNAL:
        return "internal error in the library";
    }
    return "unknown code";
}

int kvr_set_max_procs(int32_t n, int32_t *prev, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoSetMaxProcs(n, prev, err, errlen);
}

int kvr_model_domain(const kvr_model *m, char *out, size_t outlen, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoModelDomain((kvr_model *)m, out, outlen, err, errlen);
}

int kvr_layouts(char *out, size_t outlen, size_t *need, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoLayouts(out, outlen, need, err, errlen);
}

int kvr_define_layout(const char *kind, const char *name, const char *order, const char *writes, char *err,
                      size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoDefineLayout((char *)kind, (char *)name, (char *)order, (char *)writes, err, errlen);
}

int kvr_store_open(const char *url, kvr_store **store, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    uint64_t h = 0;
    int rc = kvrgoStoreOpen((char *)url, store == NULL ? NULL : &h, err, errlen);
    if (store != NULL) {
        *store = rc == KVR_OK ? (kvr_store *)(uintptr_t)h : NULL;
    }
    return rc;
}

int kvr_store_open_engine(const kvr_engine *e, const char *name, kvr_store **store, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    uint64_t h = 0;
    int rc = kvrgoStoreOpenEngine((kvr_engine *)e, (char *)name, store == NULL ? NULL : &h, err, errlen);
    if (store != NULL) {
        *store = rc == KVR_OK ? (kvr_store *)(uintptr_t)h : NULL;
    }
    return rc;
}

int kvr_store_close(kvr_store *store, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoStoreClose(handle_id(store), err, errlen);
}

int kvr_writer_open(kvr_store *store, const kvr_model *m, const kvr_placement *p, const kvr_pool *pool,
                    const char *part_layout, kvr_writer **writer, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    uint64_t h = 0;
    int rc = kvrgoWriterOpen(handle_id(store), (kvr_model *)m, (kvr_placement *)p, (kvr_pool *)pool,
                             (char *)part_layout, writer == NULL ? NULL : &h, err, errlen);
    if (writer != NULL) {
        *writer = rc == KVR_OK ? (kvr_writer *)(uintptr_t)h : NULL;
    }
    return rc;
}

int kvr_writer_publish(kvr_writer *writer, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterPublish(handle_id(writer), err, errlen);
}

int kvr_writer_write(kvr_writer *writer, const char *keys, const int64_t *offsets, const int64_t *slots,
                     int64_t n, uint8_t *statuses, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterWrite(handle_id(writer), (char *)keys, (int64_t *)offsets, (int64_t *)slots, n, statuses,
                            err, errlen);
}

int kvr_writer_stats_get(kvr_writer *writer, kvr_writer_stats *out, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterStats(handle_id(writer), out, err, errlen);
}

int kvr_writer_close(kvr_writer *writer, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoWriterClose(handle_id(writer), err, errlen);
}

int kvr_reader_open(kvr_store *store, const kvr_model *m, const kvr_placement *p, const kvr_pool *pool,
                    kvr_reader **reader, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    uint64_t h = 0;
    int rc = kvrgoReaderOpen(handle_id(store), (kvr_model *)m, (kvr_placement *)p, (kvr_pool *)pool,
                             reader == NULL ? NULL : &h, err, errlen);
    if (reader != NULL) {
        *reader = rc == KVR_OK ? (kvr_reader *)(uintptr_t)h : NULL;
    }
    return rc;
}

int kvr_reader_exists(kvr_reader *reader, const char *keys, const int64_t *offsets, int64_t n,
                      int64_t *complete, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderExists(handle_id(reader), (char *)keys, (int64_t *)offsets, n, complete, err, errlen);
}

int kvr_reader_read(kvr_reader *reader, const char *keys, const int64_t *offsets, const int64_t *slots,
                    int64_t n, kvr_read_result *res, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderRead(handle_id(reader), (char *)keys, (int64_t *)offsets, (int64_t *)slots, n, res, err,
                           errlen);
}

int kvr_reader_set_options(kvr_reader *reader, const kvr_reader_options *opts, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderSetOptions(handle_id(reader), (kvr_reader_options *)opts, err, errlen);
}

int kvr_reader_stats_get(kvr_reader *reader, kvr_reader_stats *out, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderStats(handle_id(reader), out, err, errlen);
}

int kvr_reader_close(kvr_reader *reader, char *err, size_t errlen) {
    if (kvr_forked(err, errlen)) {
        return KVR_EFORK;
    }
    return kvrgoReaderClose(handle_id(reader), err, errlen);
}
