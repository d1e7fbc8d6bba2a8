package redisstore

// PageKeys returns the keys of a page, for tests that reach behind the
// store: its meta hash, the prefix of its part keys, and its stamp.
func PageKeys(key string) (meta, partPrefix, stamp string) {
	meta, partPrefix = pageKeys(key)
	return meta, partPrefix, stampKey(key)
}
