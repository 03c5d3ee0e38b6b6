package clientaddr

import (
	"sync"
	"time"
)

// maxFailureKeys bounds a Failures table so that a flood of clients cannot
// grow it without limit. Past it, expired entries are swept, then
// arbitrary ones dropped (losing some counts beats running out of memory).
const maxFailureKeys = 1 << 16

// Failures counts failed authentications per key (a client's Prefix, or
// that and an account) over a fixed window from the key's first failure:
// the SMTP listener's AUTH and the API's keys and console sign-ins count
// alike. A success does not clear a count, so that one valid credential
// cannot be used to reset guesses at others.
type Failures[K comparable] struct {
	limit  int
	window time.Duration
	// Now is the clock; tests set it before use.
	Now func() time.Time

	mu   sync.Mutex
	keys map[K]*failureCount
}

type failureCount struct {
	first time.Time
	count int
}

// NewFailures returns a table of limit failures per window.
func NewFailures[K comparable](limit int, window time.Duration) *Failures[K] {
	return &Failures[K]{limit: limit, window: window, Now: time.Now, keys: map[K]*failureCount{}}
}

// Limit is the failures a key may make within Window.
func (f *Failures[K]) Limit() int { return f.limit }

// Window is the period failures are counted over, from the first.
func (f *Failures[K]) Window() time.Duration { return f.window }

// Wait is how long k stays at its limit: 0 when it is under it.
func (f *Failures[K]) Wait(k K) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.keys[k]
	if c == nil {
		return 0
	}
	left := c.first.Add(f.window).Sub(f.Now())
	if left <= 0 {
		delete(f.keys, k)
		return 0
	}
	if c.count < f.limit {
		return 0
	}
	return left
}

// Fail records a failure of k and returns how many it made in its window,
// this one included: 1 opens a window, Limit reaches the limit.
func (f *Failures[K]) Fail(k K) int {
	now := f.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.keys[k]
	if c == nil || now.Sub(c.first) >= f.window {
		if c == nil && len(f.keys) >= maxFailureKeys {
			f.sweep(now)
		}
		c = &failureCount{first: now}
		f.keys[k] = c
	}
	c.count++
	return c.count
}

// sweep drops expired entries, then arbitrary ones until there is room.
// f.mu is held.
func (f *Failures[K]) sweep(now time.Time) {
	for k, c := range f.keys {
		if now.Sub(c.first) >= f.window {
			delete(f.keys, k)
		}
	}
	for k := range f.keys {
		if len(f.keys) < maxFailureKeys {
			break
		}
		delete(f.keys, k)
	}
}
