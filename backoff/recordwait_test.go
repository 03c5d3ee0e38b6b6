package backoff

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestRecordAdmitWaitAndDeliveries: the admission wait and a delivery
// count above 1 are written on the log line and in the event form alike,
// read back, and left out when there is nothing to say (no wait, the
// first hand-out).
func TestRecordAdmitWaitAndDeliveries(t *testing.T) {
	rec := sampleRecord(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC))
	rec.AdmitWaitMs, rec.Deliveries = 9876, 3
	js, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := json.Marshal(rec.wire()); !bytes.Equal(js, want) {
		t.Errorf("AppendJSON = %s\nwant         %s", js, want)
	}
	var buf bytes.Buffer
	rec.LogOutcome(zerolog.New(&buf), "delivered", []string{"a@x.example"})
	for _, b := range [][]byte{js, buf.Bytes()} {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if m["admit_wait_ms"] != 9876.0 || m["deliveries"] != 3.0 {
			t.Errorf("admit_wait_ms %v deliveries %v, want 9876 and 3: %s", m["admit_wait_ms"], m["deliveries"], b)
		}
		var back Record
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.AdmitWaitMs != 9876 || back.Deliveries != 3 {
			t.Errorf("decoded admit wait %d deliveries %d from %s", back.AdmitWaitMs, back.Deliveries, b)
		}
	}

	rec.AdmitWaitMs, rec.Deliveries = 0, 1
	js, _ = json.Marshal(rec)
	buf.Reset()
	rec.LogOutcome(zerolog.New(&buf), "delivered", nil)
	for _, b := range [][]byte{js, buf.Bytes()} {
		if bytes.Contains(b, []byte("admit_wait_ms")) || bytes.Contains(b, []byte("deliveries")) {
			t.Errorf("no wait and a first hand-out written: %s", b)
		}
	}
	if want, _ := json.Marshal(rec.wire()); !bytes.Equal(js, want) {
		t.Errorf("AppendJSON = %s\nwant         %s", js, want)
	}
}
