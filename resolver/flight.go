package resolver

import (
	"context"
	"fmt"
	"sync"
)

// flights collapses concurrent lookups of one key into one query: the first
// caller runs it, later callers wait for its result (or their own context).
type flights struct {
	mu sync.Mutex
	m  map[cacheKey]*flight
}

type flight struct {
	done chan struct{}
	ans  *answer
	err  error
}

// do runs fn once for k among concurrent callers. fn gets a context that is
// not cancelled when the first caller gives up, so a caller that leaves does
// not fail the others; fn bounds its own duration.
func (f *flights) do(ctx context.Context, k cacheKey, fn func(context.Context) (*answer, error)) (*answer, error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[cacheKey]*flight{}
	}
	fl, running := f.m[k]
	if !running {
		fl = &flight{done: make(chan struct{})}
		f.m[k] = fl
	}
	f.mu.Unlock()

	if !running {
		go func() {
			defer func() {
				if r := recover(); r != nil {
					fl.err = &panicError{r}
				}
				f.mu.Lock()
				delete(f.m, k)
				f.mu.Unlock()
				close(fl.done)
			}()
			fl.ans, fl.err = fn(context.WithoutCancel(ctx))
		}()
	}
	select {
	case <-fl.done:
		return fl.ans, fl.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type panicError struct{ v any }

func (p *panicError) Error() string { return fmt.Sprintf("resolver: query panicked: %v", p.v) }
