package queue

import (
	"reflect"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestEnvelopeDSNCompat: an envelope written before the DSN fields existed
// decodes with none of them set, and one with them round-trips.
func TestEnvelopeDSNCompat(t *testing.T) {
	old, err := DecodeEnvelope([]byte(`{"id":"abc","msg_id":"abc","tenant":"t","from":"a@x","rcpts":["b@y"],"dest":"y","body_ref":"abc"}`), nats.Header{})
	if err != nil {
		t.Fatal(err)
	}
	if old.DSN != nil || old.Source != "" || old.IsReport || old.DelayWarned {
		t.Fatalf("old envelope decoded with DSN fields: %+v", old)
	}
	if !old.DSN.Wants("b@y", NotifyFailure) || !old.DSN.Wants("b@y", NotifyDelay) || old.DSN.Wants("b@y", NotifySuccess) {
		t.Error("no NOTIFY must mean failures and delays, not successes")
	}

	e := &Envelope{ID: "abc", MsgID: "abc", Rcpts: []string{"b@y", "c@y"}, Dest: "y", BodyRef: "abc",
		Source: SourceSMTP, IsReport: true, DelayWarned: true,
		DSN: &DSNParams{Ret: "FULL", EnvID: "env 1", Rcpts: map[string]RcptDSN{"b@y": {Notify: []string{NotifyNever}, ORcpt: "B@y"}}}}
	m, err := e.Encode("x")
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEnvelope(m.Data, m.Header)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.DSN, e.DSN) || got.Source != SourceSMTP || !got.IsReport || !got.DelayWarned {
		t.Fatalf("round trip: %+v", got)
	}
	if got.DSN.Wants("b@y", NotifyFailure) || !got.DSN.Wants("c@y", NotifyFailure) {
		t.Error("NEVER for b@y, default for c@y")
	}
	if p := e.DSN.For([]string{"c@y"}); p == nil || p.Rcpts != nil || p.Ret != "FULL" {
		t.Errorf("For(c@y) = %+v", p)
	}
	if p := (&DSNParams{Rcpts: map[string]RcptDSN{"b@y": {}}}).For([]string{"c@y"}); p != nil {
		t.Errorf("For of nothing = %+v", p)
	}
}
