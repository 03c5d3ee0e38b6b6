package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
)

func TestDurabilityResolution(t *testing.T) {
	for _, tc := range []struct {
		flag, old, url string
		replicas       int
		want           queue.Durability
		note, bad      bool
	}{
		{want: queue.DurabilityDisk},
		{url: "nats://n1:4222", want: queue.DurabilityReplicas},
		{flag: "none", want: queue.DurabilityNone},
		{old: "always", want: queue.DurabilityDisk, note: true},
		{old: "default", want: queue.DurabilityNone, note: true},
		{flag: "disk", old: "default", want: queue.DurabilityDisk},
		// disk with --nats-url: the daemon of that server fsyncs
		// (remoteDurability checks that one answers); not on a cluster.
		{flag: "disk", url: "nats://n1:4222", want: queue.DurabilityDisk},
		{flag: "disk", url: "nats://n1:4222", replicas: 3, bad: true},
		{flag: "replicas", bad: true},
		{flag: "fsync", bad: true},
		{old: "sometimes", bad: true},
	} {
		c := &serveConfig{Durability: tc.flag, JetStreamSync: tc.old, NATSURL: tc.url, NATSReplicas: max(tc.replicas, 1)}
		d, note, err := c.durability()
		if tc.bad {
			if err == nil {
				t.Errorf("%+v: accepted as %s", tc, d)
			}
			continue
		}
		if err != nil || d != tc.want || (note != "") != tc.note {
			t.Errorf("%+v: got %s, note %q, %v", tc, d, note, err)
		}
	}
}

// TestStartOrStop: a stop asked while the embedded server starts is
// answered at once, not after the start (which takes no context and can
// last as long as its store's recovery); a start that ends first is
// returned as it is.
func TestStartOrStop(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := startOrStop(ctx, func() (int, error) { <-release; return 1, nil })
		done <- err
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, errStoppedWhileStarting) {
			t.Fatalf("stopped during the start: %v, want errStoppedWhileStarting", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stop waited for the start")
	}
	v, err := startOrStop(context.Background(), func() (int, error) { return 7, nil })
	if v != 7 || err != nil {
		t.Fatalf("a start that ends: %d, %v", v, err)
	}
	boom := errors.New("boom")
	if _, err := startOrStop(context.Background(), func() (int, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("a start that fails: %v", err)
	}
}
