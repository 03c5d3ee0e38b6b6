package main

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"
)

// background runs run(ctx) in its own goroutine until ctx ends or the
// returned stop is called (stop waits for run to return). A panic in run
// is logged as "<name> panicked" and ends only that goroutine: the daemon
// keeps serving mail without it.
func background(ctx context.Context, log zerolog.Logger, name string, run func(context.Context)) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if p := recover(); p != nil {
				log.Error().Str("panic", fmt.Sprint(p)).Msg(name + " panicked")
			}
		}()
		run(rctx)
	}()
	return func() { cancel(); <-done }
}
