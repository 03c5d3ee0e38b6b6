package main

import (
	"strings"
	"testing"

	"github.com/outflow/outflow/throttle"
)

// TestUnknownSourceSaid: dest suspend or rate of DEST@SOURCE says when no
// running worker sends from SOURCE (a mistyped address in an incident
// leaves the blocked one sending), from the workers' status answers.
func TestUnknownSourceSaid(t *testing.T) {
	views := []throttle.WorkerStatus{
		{Worker: "w1", Sources: []throttle.DestStatus{{Dest: "gmail.com@192.0.2.10"}, {Dest: "gmail.com@192.0.2.11"}}},
		{Worker: "w2", Sources: []throttle.DestStatus{{Dest: "gmail.com@2001:db8::1"}}},
	}
	if known, ok := unknownSource(views, "192.0.2.11"); !ok || len(known) != 3 {
		t.Errorf("a worker's address: known %v, ok %v", known, ok)
	}
	if known, ok := unknownSource(views, "192.0.2.99"); ok || strings.Join(known, " ") != "192.0.2.10 192.0.2.11 2001:db8::1" {
		t.Errorf("a mistyped address: known %v, ok %v; want refused with the three listed", known, ok)
	}
	if known, ok := unknownSource([]throttle.WorkerStatus{{Worker: "w1"}}, "192.0.2.10"); ok || len(known) != 0 {
		t.Errorf("workers without egress addresses: known %v, ok %v", known, ok)
	}
}
