package plugin

import "sync"

// keyMutex serializes work per key (a volume ID or name) while letting different keys proceed in parallel.
// The zero value is ready to use.
type keyMutex struct {
	// mu guards locks.
	mu    sync.Mutex
	locks map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	// refs counts holders and waiters; guarded by keyMutex.mu.
	refs int
}

// lock blocks until the key is free and returns the function that frees it.
func (k *keyMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*refMutex{}
	}
	m, ok := k.locks[key]
	if !ok {
		m = &refMutex{}
		k.locks[key] = m
	}
	m.refs++
	k.mu.Unlock()

	m.Lock()
	return func() {
		m.Unlock()
		k.mu.Lock()
		m.refs--
		if m.refs == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}
