package testutil

import (
	"sync/atomic"
	"time"
)

// Peak samples f every interval in a goroutine of its own, from now until
// stop is called; stop waits for the goroutine and returns the largest
// value f gave. A test watches a resource (goroutines, memory) this way
// while its load runs.
func Peak(every time.Duration, f func() int64) (stop func() int64) {
	var peak atomic.Int64
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			if v := f(); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-done:
				return
			case <-tk.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		<-sampled
		return peak.Load()
	}
}
