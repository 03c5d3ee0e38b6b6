package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// ErrUnavailable is returned by Enqueue while the embedded JetStream is
// down (it shuts itself down when the disk fills up): the submission
// listener answers 451 at once instead of waiting for a timeout.
var ErrUnavailable = errors.New("JetStream is unavailable")

// minFreeToRestart is the free space the data dir's filesystem must have
// before the supervisor restarts a JetStream that ran out of disk: enough
// for the store to load and take writes again, so it does not fall over at
// once.
const minFreeToRestart = 16 << 20

// Healthy reports whether the embedded server's JetStream is running and
// able to write.
func (e *Embedded) Healthy() error {
	if !e.srv.JetStreamEnabled() {
		return fmt.Errorf("%w: the embedded server shut it down (out of disk space in %s?)", ErrUnavailable, e.storeDir)
	}
	if e.writeErr.Load() {
		return fmt.Errorf("%w: a stream could not write to %s (disk full?)", ErrUnavailable, e.storeDir)
	}
	if e.syncer != nil && e.syncer.Stopped() {
		return fmt.Errorf("%w: the store syncer stopped (see the log); nothing can be accepted as on disk", ErrUnavailable)
	}
	if e.syncer != nil {
		if err := e.syncer.Failed(); err != nil {
			return fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
	}
	return nil
}

// Supervise watches the embedded JetStream until ctx ends. When a write
// fails for lack of disk space, nats-server either shuts JetStream down or
// marks the stream's file store with a sticky write error (the stream then
// takes no more writes, and publishers hear nothing until they time out);
// on a single server nothing clears either. Supervise notices both (the
// second through the server's "critical write error" log line), makes
// Healthy fail so submissions get 451 at once, and once the filesystem has
// room again restarts JetStream from the same store, so the daemon recovers
// without a restart. Streams, consumers and stored messages come back from
// disk.
func (e *Embedded) Supervise(ctx context.Context, log zerolog.Logger, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	down := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if e.srv.JetStreamEnabled() && !e.writeErr.Load() {
			if down {
				log.Info().Msg("embedded JetStream is running again")
				down = false
			}
			continue
		}
		free, err := freeBytes(e.storeDir)
		if !down {
			log.Error().Uint64("free_bytes", free).Str("store", e.storeDir).
				Msg("embedded JetStream is down (out of disk space?); submissions get 451 until it is back")
			down = true
		}
		if err != nil || free < minFreeToRestart {
			continue
		}
		log.Info().Uint64("free_bytes", free).Msg("restarting embedded JetStream from its store")
		if e.srv.JetStreamEnabled() {
			if err := e.srv.ShutdownJetStream(); err != nil {
				log.Warn().Err(err).Msg("stop embedded JetStream")
				continue
			}
		}
		e.limitMu.Lock()
		cfg := e.jsConfig
		e.limitMu.Unlock()
		if err := e.srv.EnableJetStream(&cfg); err != nil {
			log.Warn().Err(err).Msg("restart embedded JetStream")
			continue
		}
		e.writeErr.Store(false)
	}
}

func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// natsLog passes the embedded server's warnings and errors to zerolog
// (notices at debug), so an out-of-space shutdown is in the daemon's log,
// and flags a stream's sticky write error for Supervise.
type natsLog struct {
	l        zerolog.Logger
	writeErr *atomic.Bool
}

func (n natsLog) Noticef(format string, v ...any) { n.l.Debug().Msgf(format, v...) }
func (n natsLog) Warnf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.HasPrefix(msg, "Plaintext passwords detected") {
		// The in-process user's password is plain on purpose (made for
		// this start, never written down, allowed only in process: see
		// StartEmbedded); the listener's user has a bcrypt hash. Every
		// start would otherwise warn an operator of nothing.
		n.l.Debug().Msg(msg)
		return
	}
	n.l.Warn().Msg(msg)
}
func (n natsLog) Fatalf(format string, v ...any) { n.l.Error().Msgf(format, v...) }
func (n natsLog) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(strings.ToLower(msg), "critical write error") {
		n.writeErr.Store(true)
	}
	n.l.Error().Msg(msg)
}
func (n natsLog) Debugf(format string, v ...any) {}
func (n natsLog) Tracef(format string, v ...any) {}
