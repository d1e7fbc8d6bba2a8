package memstore

import "time"

// age makes the last write to key look d older (storetest's Age).
func (s *Store) age(key string, d time.Duration) {
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if o := sh.objs[key]; o != nil {
		o.touched = o.touched.Add(-d)
	}
}
