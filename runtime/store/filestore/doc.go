// Package filestore is the embedded default store: a directory that many
// processes may use at once, so that a page written by a process that has
// exited can be read by another. It registers the URL scheme file:
//
//	file:///abs/dir               the store in /abs/dir, created if missing
//	file://localhost/abs/dir      the same
//	file:///abs/dir?lease=30s     the same with a lease of 30s (Options.Lease)
//	file:///abs/dir?lock-wait=1s  the same with a lock wait of 1s (Options.LockWait)
//
// The path must be absolute; any other host, and any user, port, query
// parameter but lease and lock-wait (each at most once), or fragment, is a
// *store.URLError.
//
// # Files
//
// A key, arbitrary bytes, becomes a file name made of its escaped first bytes
// (letters, digits, '-' and '_' kept, every other byte as %XX) and a SHA-256
// prefix of the whole key, so that no key can name a path outside the store
// and names differ even on a case-insensitive file system:
//
//	objects-v3/<h>/<name>/claim           part count, generation, newline, manifest key
//	objects-v3/<h>/<name>/part-<gen>-<i>  the bytes of part i
//	objects-v3/<h>/<name>/lock            locked by writers taking the object over (flock)
//	meta/<h>/<name>                       a metadata object
//
// where <h> is the first two hex digits of the hash and <gen> the claim's
// generation, 16 random hex digits. A part's size is its file's size. Every
// file is written whole to a temporary file
// beside it and then hard-linked into place, which fails if the name exists:
// the first claim, the first copy of a part and the first metadata object
// win atomically across processes, and a process killed mid-write leaves at
// most a temporary file (".tmp-*"), never a part that reads as written. A
// retry of a part that is already written writes nothing and succeeds. An
// object is complete when its claim and all the parts of the claim's
// generation exist; a complete object never changes, so each process caches
// what it learns of complete objects, and keeps a bounded set of open part
// files for positioned reads: at most a quarter of the process's open-file
// limit, and when an open fails for want of descriptors the cached files are
// closed and the open is tried again. Query reads claims and the sizes of
// part files, leaving the part files it opens in that set for the reads
// that follow; it never reads part data.
//
// Every file is opened without blocking and must be a regular file: a
// directory, FIFO, device or symbolic link where a claim, part, lock or
// metadata file should be is an error naming the path. Every size and count
// read from a file is bounded before it is used (store.MaxParts,
// store.MaxMetaBytes); a claim or part that does not parse makes its object
// unreadable, reported in that object's store.Object.Err, and no other.
//
// # Leases and takeover
//
// A writer writes a part holding the lock of the claim file (flock), shared
// with the other writers of the claim's generation, and sets the claim's
// modification time when it begins the part, while it writes it (at least
// every quarter of the lease) and when it has linked it: the claim's age is
// the time since a writer of the object was last seen working. An
// incomplete object whose claim is older than the lease (Options.Lease,
// store.DefaultLease by default) is abandoned, and may be taken over by a
// writer of another layout. It takes the claim's lock exclusively, which
// waits for writers finishing a part; takes the object's lock file
// exclusively, so that takeovers of an object go one at a time; checks
// again; replaces the claim, by rename, with its own of a new generation;
// and removes the parts of the old one. A claim that does not parse may be
// taken over the same way. A part of an old generation never counts
// towards a new one.
//
// A writer that holds a lock but is not writing (stopped by a signal or a
// debugger, swapped out) holds up no takeover: its claim ages like an
// abandoned one, so a writer that still cannot have the claim's lock after
// the lock wait (Options.LockWait, DefaultLockWait by default) takes the
// object over without it, and one that finds the lock file held since
// longer ago than the lease (its holder sets the file's modification time)
// goes on without that too. The new claim is a new file with a lock of its
// own: the new layout's writers never wait for the stopped one. When the
// stopped writer resumes, it finds that its claim is no longer the
// object's once it has linked its part (or failed to: its temporary file
// may be gone), removes the part and is refused (store.ErrLayoutConflict);
// it refreshed only the time of its own, replaced, claim file. A complete
// object is never taken over by a writer that got the claim's lock; one
// that went on without it may, if the stopped writer it passed over resumes
// at that very instant and completes the object, replace a complete object:
// a reader then finds it missing or fails to read it, and never reads bytes
// of one layout as another's. Locks are released when a process dies, so an
// object abandoned by a killed writer is free once the lease has passed.
//
// No writer waits for another without bound, and none blocks in flock: a
// lock that another writer holds is tried again, with a short backoff, for
// at most the lock wait and until the context's deadline, and cancelling
// the context ends the wait at once with the context's error. The lock
// wait is a batch's (one WriteParts), not a part's: once a batch has
// waited that long in all, a part whose lock is held fails at once. Only a
// writer that holds a claim's lock exclusively, which a live one does for
// a moment, makes writers of that claim wait; if it is stopped, their parts
// fail after the wait with an error that names the lock file and the wait,
// and the other writes of the batch go on.
//
// When a writer gets the claim's lock exclusively without waiting (no other
// writer of the generation is writing) and that claim is still the
// object's (not replaced since it opened it), it removes the object's temporary
// files older than the lease (a killed writer's) and the parts of
// generations other than the claim's (left by a takeover that was itself
// killed, or by a stopped writer of an old claim); so does a takeover. It
// lists the directory before it checks the claim, so that even a writer
// stopped between the two removes no part that a claim names. Temporary
// files in meta/, left by a writer killed in PutMeta, are not removed; they
// are harmless and may be deleted while no process writes.
//
// # Durability
//
// By default nothing is synced: the store survives any process crash, but
// after an operating-system crash or power loss recently written files may
// hold zeros or be cut short (a part's checksums then no longer match its
// bytes). The store is a cache; wipe its directory after such a crash, or
// open it with Options.Sync, which syncs every file before linking it and
// the directory after. A store written by an earlier version of this package
// (an objects or objects-v2 directory instead of objects-v3) reads as
// empty; delete the old directory.
package filestore
