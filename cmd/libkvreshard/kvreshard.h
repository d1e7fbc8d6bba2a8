/*
 * kvreshard.h: the C API of libkvreshard, ABI version 2.1.
 *
 * libkvreshard writes the KV-cache pages of one serving rank's host pool
 * into a store and reads them back into any other rank's pool, whatever the
 * writer's and the reader's TP, PP, CP (context parallelism) and memory
 * layouts. It is kvreshard's Go runtime built as a shared library; this
 * hand-written header is its stable interface (the header Go generates
 * beside the library is not: do not include it).
 *
 * Build (from the repository root, Go 1.26 and gcc):
 *
 *     go build -buildmode=c-shared -o libkvreshard.so ./cmd/libkvreshard
 *
 * and compile against it:
 *
 *     gcc -I cmd/libkvreshard app.c -L. -lkvreshard -Wl,-rpath,'$ORIGIN'
 *
 * Conventions (as SQLite's and zstd's):
 *
 *   - Every function but kvr_version and kvr_errstr returns an int code,
 *     KVR_OK (0) on success, and takes `char *err, size_t errlen`: it
 *     writes a NUL-terminated message there (lower-case, naming what is
 *     wrong and where; truncated to fit, at a UTF-8 boundary; err may be
 *     NULL, and errlen 0 writes nothing; a NUL byte within the message, as
 *     of a store's error, is written as the four characters \x00). On
 *     KVR_OK the message is empty, except that kvr_reader_read says there
 *     why it stopped early and kvr_writer_write names the first page that
 *     was refused or failed. kvr_errstr(code) describes a code.
 *   - Nothing is allocated across the boundary: every output goes into memory
 *     the caller passes. C never holds a Go pointer.
 *   - Handles are pointers to the opaque types kvr_store, kvr_writer and
 *     kvr_reader, so that a writer passed where a reader is expected does
 *     not compile. A handle's value is an id, never dereferenced, never a
 *     Go pointer, never NULL once opened and never reused. Each is closed
 *     explicitly with its own close function; closing NULL does nothing and
 *     returns KVR_OK (as free(NULL)). A closed handle gives KVR_ECLOSED; a
 *     handle of another kind forced in by a cast (a writer given to a
 *     reader function) and a NULL handle KVR_EINVAL.
 *   - Structs grow: each begins with `uint32_t size`, which the caller sets
 *     to sizeof the struct as it compiled it; zero-initialize the rest
 *     (`kvr_model m = {.size = sizeof m, ...};`) so that fields it does not
 *     set mean what their 0 says. A size smaller than the struct's first
 *     version (ABI 2.0), or larger than 4096, is KVR_EINVAL naming the
 *     struct. The library reads the fields of an input (kvr_model,
 *     kvr_placement, kvr_pool, kvr_reader_options, kvr_engine) that lie
 *     within size, a field past it as 0, and refuses bytes past the fields
 *     it knows that are not 0 (a field of a newer header it cannot honour):
 *     KVR_EINVAL naming the byte. Of an output (kvr_read_result,
 *     kvr_reader_stats, kvr_writer_stats) it writes the fields that fit in
 *     size, and 0 into bytes past the fields it knows; it never writes
 *     size.
 *   - Versions: KVR_ABI_VERSION is the major version, which changes when
 *     an existing function or struct changes incompatibly: a library of
 *     another major is not this API. KVR_ABI_MINOR counts the additions
 *     since (functions, struct fields at the end, codes); a function
 *     marked "ABI 2.N" below is missing from a library of a minor below N.
 *     Check the library's version with kvr_version before calling a
 *     function of a higher minor than the library's (look it up with dlsym
 *     when the program may load an older library).
 *   - Every function may be called from several threads at once, on the same
 *     handles. A close waits for the calls in progress on that handle; after
 *     it returns the library does not touch the handle's pool again.
 *   - A store handle may be closed while writers or readers opened on it are
 *     still open: its handle is then closed at once, and the store itself
 *     when the last of them closes.
 *   - Fork: Go does not survive fork(). Every function except kvr_version
 *     and kvr_errstr, called in a forked child of the process that loaded
 *     the library, returns KVR_EFORK at once, without entering Go: the
 *     library marks a child with a pthread_atfork handler (fork() of the C
 *     library runs it; Python's os.fork and multiprocessing's fork do), and
 *     the message names the child and the process that loaded the library.
 *     Load the library in processes started by spawn or exec, or after the
 *     fork.
 *   - Pointers the caller passes must be valid for the sizes it states;
 *     a wrong pointer is undefined behaviour, as in any C library.
 *
 * Keys: a page's key is its identity within the model (for SGLang its page
 * hash, a hash of the token prefix): a non-empty byte string without '_'
 * and without a NUL byte (a call given either is KVR_EINVAL naming the key's
 * index, as "key 3 contains a NUL byte"); any other byte may be in it. A
 * batch of n keys is one buffer holding them concatenated and n + 1 offsets:
 * key i is keys[offsets[i] .. offsets[i+1]). The library stores page `key`
 * under "kvreshard_" key "_" <model domain>, so that the model's name,
 * revision, namespace, fingerprint, dtype and shape (its domain, see
 * kvr_model_domain) are part of every store key: pages of another dtype or
 * tenant are never shared. The kvreshard command's `read --pages N` reads
 * the pages whose keys are the 16-hex-digit numbers i * 0x9e3779b97f4a7c15
 * (printf "%016" PRIx64), i = 0..N-1, of a model with the same fields.
 */
#ifndef KVRESHARD_H
#define KVRESHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes, major and minor; kvr_version()
 * returns the library's. */
#define KVR_ABI_VERSION 2
#define KVR_ABI_MINOR 1

/* Return codes (kvr_errstr describes each). */
#define KVR_OK 0        /* success */
#define KVR_EINVAL 1    /* bad argument: model, placement, pool, keys, slots, handle kind, struct size */
#define KVR_ESTORE 2    /* the store failed or cannot be reached (connection, I/O, timeout) */
#define KVR_EMANIFEST 3 /* a manifest was rejected (publish read back other bytes) */
#define KVR_ECLOSED 4   /* closed or unknown handle */
#define KVR_EFORK 5     /* called in a forked child of the process that loaded the library */
#define KVR_EINTERNAL 6 /* a bug in the library; the message says what */

/* What kvr_writer_write did with each page (one byte per page). */
#define KVR_WRITTEN 0  /* this rank's part of the page was written */
#define KVR_COMPLETE 1 /* the page was already complete: skipped, its stored layout kept */
#define KVR_REFUSED 2  /* the page is being written in another layout */
#define KVR_REPLICA 3  /* this rank holds a replica of heads another TP rank writes */
#define KVR_FAILED 4   /* the write failed (err names the first such page) */

/* Why kvr_reader_read stopped before the last page (kvr_read_result.stop). */
#define KVR_STOP_NONE 0     /* every page was read */
#define KVR_STOP_MISS 1     /* a page is missing, incomplete, or went away while read */
#define KVR_STOP_BUDGET 2   /* the prefetch budget was reached */
#define KVR_STOP_CANCELED 3 /* the read was canceled */
#define KVR_STOP_MANIFEST 4 /* a page's manifest was rejected (missing, corrupt, another model) */
#define KVR_STOP_FAILED 5   /* the store failed (connection, I/O, timeout): kvr_reader_read returns KVR_ESTORE */
#define KVR_STOP_CHECKSUM 6 /* a page is damaged: bytes failed their checksums (check_parts), or a part's size is not its manifest's */

/* The opaque handles (see the conventions above). */
typedef struct kvr_store kvr_store;
typedef struct kvr_writer kvr_writer;
typedef struct kvr_reader kvr_reader;

/* A model: everything that changes the content of its KV cache. */
typedef struct {
    uint32_t size;      /* sizeof(kvr_model) */
    int32_t layers;     /* 1..4096; the layers are 0..layers-1 */
    int32_t kv_heads;   /* KV heads of the whole model */
    int32_t head_dim;   /* elements of a K head (of the latent with mla) */
    int32_t v_head_dim; /* elements of a V head; 0 = head_dim; must be 0 with mla */
    int32_t page;       /* tokens per page */
    int32_t mla;        /* 0, or 1: one latent component instead of K and V */
    /* 0..layers: the last draft_layers of the layers are the draft layers of
     * speculative decoding (MTP) that a page holds after the model's own
     * (SGLang folds them into its host pool). They enter the model domain,
     * so that pages with and without them never share a key; 0 gives the
     * domain of a model without draft layers. */
    int32_t draft_layers;
    const char *dtype; /* "fp32", "bf16", "fp16" or "fp8" */
    /* The model's identity, NUL-terminated UTF-8; NULL = "". They enter the
     * model domain, so that another model, revision, tenant or semantic
     * variant never shares pages. The kvreshard command's defaults are
     * name "model", revision "0", namespace "kvreshard", fingerprint "". */
    const char *name, *revision, *namespace_, *fingerprint;
} kvr_model;

/* A rank's place in a TP x PP x CP topology. */
typedef struct {
    uint32_t size;            /* sizeof(kvr_placement) */
    int32_t tp, pp;           /* tensor- and pipeline-parallel sizes */
    int32_t tp_rank, pp_rank; /* this rank: 0 <= tp_rank < tp, 0 <= pp_rank < pp */
    /* Context parallelism: a page's tokens are dealt to cp ranks in runs of
     * cp_interleave tokens, round-robin, so that token p of a page belongs to
     * CP rank (p / cp_interleave) % cp, and local token j of CP rank c is
     * token ((j / cp_interleave) * cp + c) * cp_interleave + j % cp_interleave
     * of the page (SGLang's DCP: cp_interleave 1; vLLM's DCP:
     * --cp-kv-cache-interleave-size; page / cp: contiguous slices). 0 means
     * cp 1, cp_rank 0 and cp_interleave 1 (no context parallelism).
     * cp_interleave must divide the page, cp x cp_interleave too, and cp is at
     * most the page's tokens (and 1024); 0 <= cp_rank < cp. Every rank of a
     * topology uses the same cp and cp_interleave. A pool of a CP rank holds
     * page / cp tokens a page (see kvr_pool). */
    int32_t cp, cp_rank, cp_interleave;
    /* The layers of each PP stage, pp entries summing to the model's layers,
     * or NULL for kvreshard's even split (remainder to the first stages).
     * Frameworks split differently: pass the framework's split. */
    const int32_t *pp_layers;
} kvr_placement;

/* A rank's host pool: caller-owned memory registered at open. It must stay
 * valid, and not be freed or unmapped, until the writer or reader that uses
 * it is closed. The pool holds the rank's share only: its layers (PP), its
 * KV heads (TP) and its tokens (CP). With context parallelism of cp ranks a
 * slot holds page / cp tokens, the CP rank's own, in their order in the page
 * (local token j as kvr_placement says): the token extent of every layout
 * below is page / cp, not page. */
typedef struct {
    uint32_t size; /* sizeof(kvr_pool) */
    /* The layout's regions in order: K then V (2), or the latent (1) with
     * mla, when the layout has C outermost; else one region holding every
     * component. Each holds at least the region's bytes for `slots` pages;
     * only those bytes are ever touched. Regions must not overlap. */
    int32_t nregions;
    /* A pool layout: "page_first" ([slot][token][layer][head][dim] per
     * component), "page_first_direct" ([slot][layer][token][head][dim]),
     * "layer_first" ([layer][slot][token][head][dim]) or "page_head"
     * ([slot][head][token][layer][dim]): SGLang's host pools; or a pool
     * layout defined with kvr_define_layout (kvr_layouts lists them). */
    const char *layout;
    void *const *bases;    /* nregions base addresses */
    const uint64_t *sizes; /* nregions sizes in bytes */
    int64_t slots;         /* pages the pool holds */
} kvr_pool;

/* kvr_version returns the major ABI version of the library
 * (KVR_ABI_VERSION of the header it was built with) and puts its minor
 * version (KVR_ABI_MINOR) into *minor when minor is not NULL. A program
 * compiled against this header works with a library of the same major
 * and a minor at least that of the functions it calls. */
int kvr_version(int32_t *minor);

/* kvr_errstr returns a static description of a return code, as "invalid
 * argument" for KVR_EINVAL, and "unknown code" for a code this library
 * does not have. It never fails and may be called in a forked child. */
const char *kvr_errstr(int code);

/* The most kvr_set_max_procs sets, unless the process may run on more
 * CPUs (see there). */
#define KVR_MAX_PROCS 1024

/* kvr_set_max_procs caps at n the threads that run Go code at once
 * (GOMAXPROCS); n <= 0 only reads the cap. *prev (when prev is not NULL)
 * gets the cap before the call. Call it before opening readers: a reader
 * runs its copies on as many threads as the cap at its open (or at its
 * kvr_reader_set_options). Eight ranks on one host each capped at cores/8
 * do not start a thread per core each.
 *
 * n is at most KVR_MAX_PROCS, or the CPUs the process could run on when the
 * library was loaded when they are more (so that the runtime's default,
 * which is at most those, can always be set again): a larger n is
 * KVR_EINVAL, and changes nothing (*prev is not written). Each unit of the
 * cap costs memory (about 15 KB; a cap of 100000 took 1.4 GiB) and more
 * than the CPUs run nothing more at once. */
int kvr_set_max_procs(int32_t n, int32_t *prev, char *err, size_t errlen);

/* kvr_model_domain writes the model domain of *m, 64 lower-case hex digits
 * and a NUL, into out (outlen at least 65). */
int kvr_model_domain(const kvr_model *m, char *out, size_t outlen, char *err, size_t errlen);

/* Layouts (ABI 2.1). A layout says where the elements of a page lie: a
 * part layout, how a writer rank's share of a page lies in the store; a
 * pool layout, how a rank's host pool holds its pages. Its order names the
 * axes outermost first, in the words of the .kvl language (layouts/, dsl/):
 * C the component (K, V), S the pool's slot, T the token, L the layer, H
 * the KV head, D the element; X/n and X%n split axis T or D into blocks of
 * n elements, outer part first. page_first is "C S T L H D"; vLLM's
 * x-blocked key cache "C L H D/8 T D%8". With C outermost each component
 * is a region of its own (kvr_pool). The library knows the seven built-ins
 * (layouts/builtin.kvl), the layouts of Go packages linked into it (kvlc),
 * and those defined with kvr_define_layout. A pair of layouts without a
 * kernel generated by kvlc runs on the library's interpreter, byte-exact
 * and slower (kvr_reader_stats.fallbacks counts its plans). */

/* kvr_layouts (ABI 2.1) writes the layouts the library knows into out, one
 * line a layout, in the order they were registered (the built-ins first):
 *
 *     kind TAB name TAB order TAB writes LF
 *
 * kind is "part" or "pool"; order is the axes separated by single spaces
 * ("C L H D/8 T D%8"); writes is the part layout a pool's writers store
 * pages in when they name none, empty for a part layout and for a pool
 * that names none. A NUL follows the last line. No field holds a tab or a
 * line feed. A later minor version may add fields at the end of a line:
 * split a line at its tabs and ignore the fields past those you know.
 *
 * *need, when need is not NULL, gets the bytes of the text with its NUL.
 * out NULL and outlen 0 ask for *need alone (KVR_OK). An out of fewer
 * bytes is KVR_EINVAL (out gets "" when outlen > 0): another thread may
 * define a layout between the two calls, so call again with the new
 * *need. */
int kvr_layouts(char *out, size_t outlen, size_t *need, char *err, size_t errlen);

/* kvr_define_layout (ABI 2.1) registers, for the rest of the process, the
 * layout of kind ("part" or "pool") called name whose axes are order (as
 * kvr_layouts writes them; any white space between axes): pools
 * (kvr_pool.layout) and writers (kvr_writer_open's part_layout) may then
 * name it. writes, for a pool, names the registered part layout its
 * writers store pages in when they name none; NULL or "" for none (its
 * writers must name one). Generated kernels are found by kind and order,
 * not by name: a layout of another order than the built-ins' runs its
 * pairs on the interpreter.
 *
 * An invalid declaration is KVR_EINVAL with the errors kvlc's checker
 * gives for the same layout in a .kvl file, in its order, at columns of
 * the order: `layout "x": order "C T T H D": layout x is missing axis L;
 * column 5: axis T appears twice in layout x, first at 1:3`. Defining a layout again
 * with the same kind, order and writes does nothing and is KVR_OK; any
 * other declaration under the name of a layout the library knows is
 * KVR_EINVAL naming both. */
int kvr_define_layout(const char *kind, const char *name, const char *order, const char *writes, char *err,
                      size_t errlen);

/* kvr_store_open opens the store a URL names: "file:///abs/dir" (a
 * directory shared by processes, created if missing), "mem://" (a new
 * store in this process) or "mem://name" (one per name in this process),
 * "redis://host:port" or "redis+cluster://host:port", and puts its handle
 * into *store (NULL when the call fails). A malformed URL is KVR_EINVAL, a
 * store that cannot be reached KVR_ESTORE. */
int kvr_store_open(const char *url, kvr_store **store, char *err, size_t errlen);

/* kvr_store_close closes a store handle (see the conventions on closing a
 * store that writers or readers still use). */
int kvr_store_close(kvr_store *store, char *err, size_t errlen);

/* An object engine: a store of immutable objects under byte-string keys
 * that the host process has a client of (Mooncake Store, a NIXL-backed
 * store, 3FS), handed to the library as a table of callbacks. The library
 * keeps its pages there as objects (a page's claim, its parts, whose keys
 * name their manifest, and a commit put once every part exists), so that a
 * page is visible only when complete and parts of two layouts never mix;
 * objects that vanish (eviction, a client that exited with its memory) make
 * their page a miss, never a partial one. The manifests are objects too,
 * under keys that start with "meta/": few and small, and needed by every
 * page of their layout, so an engine that can keep objects from eviction
 * should keep those (Mooncake's engine puts them soft-pinned).
 *
 * Every callback gets ctx first. Keys come as one buffer and n + 1 offsets,
 * as elsewhere in this API. A callback returns 0, or a negative value when
 * the whole call failed, after writing a NUL-terminated message into err
 * (errlen bytes). Callbacks run on the library's threads, several at once,
 * and must not call the library back. A Python engine's callbacks take the
 * GIL (ctypes does): call the library with the GIL released (ctypes.CDLL
 * does). Pointers the library passes are valid during the call only.
 *
 *   put: store n objects; object i is the frag_off[i+1] - frag_off[i]
 *     fragments frags[frag_off[i]..], of frag_lens bytes each, in memory
 *     registered or not. An object whose key exists keeps its value (the
 *     first writer wins) and is no failure. results[i]: 0, or negative.
 *   get: read n small objects whole: object i into bufs[i], of caps[i]
 *     bytes; sizes[i] = its size, or KVR_ENGINE_MISSING. A size past
 *     caps[i] is no failure: the library asks again with a larger buffer.
 *   exists: exists[i] = 1 when object i exists, else 0.
 *   sizes: sizes[i] = the size of object i, or KVR_ENGINE_MISSING.
 *   read: read nranges byte ranges into registered memory: range j reads
 *     lens[j] bytes at offset offs[j] of object keys[j] (an index into the
 *     nkeys keys) into dst[j], which lies in the memory registered at base[j]
 *     (dst[j] - base[j] is its offset there). whole[j] is 1 when the range
 *     is the whole object. results[j]: the bytes read, KVR_ENGINE_MISSING
 *     for a missing object, or another negative value. The ranges of one
 *     call are what one read of the library needs: an engine may send them
 *     in one request (Mooncake: get_into_ranges).
 *   remove: remove n objects; a missing one is no failure.
 *   register_memory, unregister_memory: register memory [base, base+len)
 *     for transfers, until unregistered; the library registers each pool it
 *     is given (kvr_writer_open, kvr_reader_open) and the staging memory it
 *     maps. NULL when the engine needs no registration.
 *   close: release ctx; called once, when the store closes. May be NULL.
 *
 * read_timeout_ms bounds how long the library waits for a read callback
 * (0: as long as it takes). An engine whose reads may not return while a
 * dead peer is retried (Mooncake's range reads) needs one: such a read
 * fails, and the library then reads only into memory of its own, never a
 * pool, and unmaps memory an abandoned read may still write into only
 * once the callback returned. lease_ms is how long after its claim an
 * incomplete page may be taken over by a writer of another layout (0: 10
 * minutes). */
#define KVR_ENGINE_MISSING (-1)

typedef struct {
    uint32_t size; /* sizeof(kvr_engine) */
    void *ctx;
    int (*put)(void *ctx, int64_t n, const char *keys, const int64_t *offsets, const void *const *frags,
               const int64_t *frag_lens, const int64_t *frag_off, int32_t *results, char *err, size_t errlen);
    int (*get)(void *ctx, int64_t n, const char *keys, const int64_t *offsets, void *const *bufs, const int64_t *caps,
               int64_t *sizes, char *err, size_t errlen);
    int (*exists)(void *ctx, int64_t n, const char *keys, const int64_t *offsets, uint8_t *exists, char *err,
                  size_t errlen);
    int (*sizes)(void *ctx, int64_t n, const char *keys, const int64_t *offsets, int64_t *sizes, char *err,
                 size_t errlen);
    int (*read)(void *ctx, int64_t nkeys, const char *keys, const int64_t *offsets, int64_t nranges,
                const int64_t *key, const int64_t *offs, void *const *dst, const int64_t *lens, void *const *base,
                const uint8_t *whole, int64_t *results, char *err, size_t errlen);
    int (*remove)(void *ctx, int64_t n, const char *keys, const int64_t *offsets, char *err, size_t errlen);
    int (*register_memory)(void *ctx, void *base, uint64_t len, char *err, size_t errlen);
    int (*unregister_memory)(void *ctx, void *base, uint64_t len, char *err, size_t errlen);
    void (*close)(void *ctx);
    int64_t read_timeout_ms;
    int64_t lease_ms;
} kvr_engine;

/* kvr_store_open_engine opens a store on the engine *e (read at the call;
 * the callbacks and ctx must stay valid until the store closes) and puts
 * its handle into *store (NULL when the call fails). name names the store
 * in messages and picks its cost model: "mooncake://..." or
 * "engine:<name>". put, get, exists, sizes, read and remove are required. */
int kvr_store_open_engine(const kvr_engine *e, const char *name, kvr_store **store, char *err, size_t errlen);

/* kvr_writer_open opens the writer of rank *p of model *m, whose pages are
 * in *pool, and puts its handle into *writer (NULL when the call fails).
 * The pages are stored in part layout part_layout: "PLHD" (token-major),
 * "LPHD" (layer-major), "HPLD" (head-major), or a part layout defined with
 * kvr_define_layout; NULL takes the one the pool's layout writes: PLHD for
 * page_first, LPHD for page_first_direct and layer_first, HPLD for
 * page_head (kvr_layouts lists them). Every rank of one topology must use
 * the same. */
int kvr_writer_open(kvr_store *store, const kvr_model *m, const kvr_placement *p, const kvr_pool *pool,
                    const char *part_layout, kvr_writer **writer, char *err, size_t errlen);

/* kvr_writer_publish stores the writer's manifest (its topology and part
 * layout) as a pinned metadata object, reads it back and compares; the
 * first kvr_writer_write does it when it was not done. Other bytes read
 * back are KVR_EMANIFEST, a store that fails KVR_ESTORE. */
int kvr_writer_publish(kvr_writer *writer, char *err, size_t errlen);

/* kvr_writer_write writes this rank's part of the n pages keys (see Keys
 * above), page i held at pool slot slots[i], and puts one KVR_WRITTEN ..
 * KVR_FAILED byte per page into statuses. It skips pages already complete.
 * A page is readable once every part of it is written (every PP stage,
 * every distinct head interval of TP, every CP rank's tokens). It returns
 * an error only for bad arguments, a failed publish, or a failed batch
 * query (KVR_ESTORE, every status KVR_FAILED); a page that was refused or
 * failed is KVR_OK, named in err. */
int kvr_writer_write(kvr_writer *writer, const char *keys, const int64_t *offsets, const int64_t *slots,
                     int64_t n, uint8_t *statuses, char *err, size_t errlen);

/* A writer's counters since its open. */
typedef struct {
    uint32_t size;    /* sizeof(kvr_writer_stats), set by the caller */
    int64_t requests; /* kvr_writer_write calls with valid arguments and pages */
    int64_t pages;    /* pages given to them */
    /* Pages by status; the pages of a batch whose query failed are failed. */
    int64_t written, complete, refused, replica, failed;
    int64_t bytes; /* bytes of the parts written */
} kvr_writer_stats;

/* kvr_writer_stats_get puts the writer's counters into *out (out->size
 * set by the caller). */
int kvr_writer_stats_get(kvr_writer *writer, kvr_writer_stats *out, char *err, size_t errlen);

/* kvr_writer_close closes a writer handle. */
int kvr_writer_close(kvr_writer *writer, char *err, size_t errlen);

/* kvr_reader_open opens the reader of rank *p of model *m into *pool and
 * puts its handle into *reader (NULL when the call fails). It reads pages
 * written by any topology and part layout of the same model. */
int kvr_reader_open(kvr_store *store, const kvr_model *m, const kvr_placement *p, const kvr_pool *pool,
                    kvr_reader **reader, char *err, size_t errlen);

/* kvr_reader_exists puts into *complete how many leading pages of the n
 * keys a read would read now: complete in the store, with a manifest this
 * reader accepts. A page past them that is missing is no error; one whose
 * manifest is rejected is KVR_OK with the reason in err; a query that
 * fails is KVR_ESTORE (with *complete the pages before it). */
int kvr_reader_exists(kvr_reader *reader, const char *keys, const int64_t *offsets, int64_t n,
                      int64_t *complete, char *err, size_t errlen);

/* What one kvr_reader_read did. */
typedef struct {
    uint32_t size; /* sizeof(kvr_read_result), set by the caller */
    int32_t stop;  /* KVR_STOP_*: why it stopped before the last page */
    int64_t hit;   /* leading pages read in full; only their slots may be used */
    int64_t bytes; /* bytes read into the pool */
    int64_t ops;   /* range reads issued */
} kvr_read_result;

/* kvr_reader_read reads the leading run of complete pages of the n keys,
 * page i into pool slot slots[i] (slots distinct), and says in *res how
 * many it read in full (res->size set by the caller). Where it stopped
 * early, res->stop says why and err the reason, and the slots of pages
 * past res->hit may hold partial bytes.
 *
 * A miss, the prefetch budget, a rejected manifest and a page that failed
 * its checksums (KVR_STOP_CHECKSUM) are KVR_OK: the store answered, and
 * the caller goes on as for a miss (the page is recomputed; a checksum
 * failure is that page's bytes, corrupt or another page's, not a store
 * that is down, and kvr_reader_stats counts it). A store that failed
 * (connection, I/O, a read past the engine's timeout) is KVR_ESTORE with
 * res->stop KVR_STOP_FAILED: *res is filled all the same, and the res->hit
 * leading pages are read in full and may be used. Any other error is a bad
 * argument, and then *res is not written. */
int kvr_reader_read(kvr_reader *reader, const char *keys, const int64_t *offsets, const int64_t *slots,
                    int64_t n, kvr_read_result *res, char *err, size_t errlen);

/* How a reader's reads run (kvr_reader_set_options). Zero-initialize it
 * and set size to sizeof(kvr_reader_options): every field's 0 is its
 * default.
 *
 *   copy_workers: the threads that copy a read's staged bytes into the
 *     pool, the calling one included; 0 = the GOMAXPROCS cap at this call
 *     (kvr_set_max_procs), 1 = the calling thread alone; at most 1024.
 *     With more than one, a read of 1 MiB or more of this rank's bytes runs
 *     on a thread of the library while the calling thread waits (smaller
 *     reads cannot use a second worker).
 *   max_pages, max_bytes: the prefetch budget of one read, in pages and in
 *     bytes of this rank's pool: pages past it are not read and the read
 *     stops with KVR_STOP_BUDGET; 0 = no limit.
 *   check_parts: 1 checks every byte a read copies into the pool against
 *     the checksums its part was stored with (they bind the page's key,
 *     the manifest and the part number): a part that fails, or was copied
 *     from another page, stops the read at its page with KVR_STOP_CHECKSUM
 *     and the reason in err, and none of its page is a hit. Reads are then
 *     staged, and read the checksum blocks (1 KiB) around the bytes needed
 *     and each part's checksums. 0 checks nothing. */
typedef struct {
    uint32_t size; /* sizeof(kvr_reader_options) */
    int32_t copy_workers;
    int64_t max_pages, max_bytes;
    int32_t check_parts;
    /* 0. Where a later minor puts its next field, which a library that
     * does not know it must see (the struct would have 4 bytes of padding
     * here otherwise, which the library could not tell from a field). */
    int32_t reserved;
} kvr_reader_options;

/* kvr_reader_set_options sets the reader's options, from its next call on
 * (it waits for the calls in progress); a reader opens with every option
 * 0. A value out of range is KVR_EINVAL naming it; nothing changes then.
 * The reader's counters go on; its caches of manifests and plans start
 * empty. */
int kvr_reader_set_options(kvr_reader *reader, const kvr_reader_options *opts, char *err, size_t errlen);

/* A reader's counters since its open. */
typedef struct {
    uint32_t size;              /* sizeof(kvr_reader_stats), set by the caller */
    int64_t requests;           /* kvr_reader_read calls */
    int64_t pages;              /* pages requested */
    int64_t hits;               /* pages read in full */
    int64_t misses;             /* pages requested but not read */
    int64_t bytes;              /* bytes read into the pool */
    int64_t ops;                /* range reads issued */
    int64_t manifests_rejected; /* manifests missing, corrupt or of another model */
    int64_t fallbacks;          /* layouts planned on the interpreter (no generated kernel) */
    int64_t parts_checked;      /* parts of pages checked against their checksums (check_parts) */
    int64_t checksum_errors;    /* pages damaged: bytes not matching their checksums, or parts their manifest's size */
} kvr_reader_stats;

/* kvr_reader_stats_get puts the reader's counters into *out (out->size
 * set by the caller). */
int kvr_reader_stats_get(kvr_reader *reader, kvr_reader_stats *out, char *err, size_t errlen);

/* kvr_reader_close closes a reader handle. */
int kvr_reader_close(kvr_reader *reader, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* KVRESHARD_H */
