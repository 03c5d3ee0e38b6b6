package main

import (
	"testing"

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
