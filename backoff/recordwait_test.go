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

// TestRecordSaysWhereItWent: the MX host, its address and the egress
// source of the attempt are on the log line and in the event form, read
// back, and left out when empty.
func TestRecordSaysWhereItWent(t *testing.T) {
	rec := sampleRecord(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC))
	rec.MX, rec.MXAddr, rec.Source = "mx1.example.com", "192.0.2.25:25", "198.51.100.7"
	js, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	rec.LogOutcome(zerolog.New(&buf), "delivered", []string{"a@x.example"})
	for _, b := range [][]byte{js, buf.Bytes()} {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if m["mx"] != "mx1.example.com" || m["mx_addr"] != "192.0.2.25:25" || m["source"] != "198.51.100.7" {
			t.Errorf("mx %v mx_addr %v source %v: %s", m["mx"], m["mx_addr"], m["source"], b)
		}
		var back Record
		if err := json.Unmarshal(b, &back); err != nil || back.MX != rec.MX || back.MXAddr != rec.MXAddr || back.Source != rec.Source {
			t.Errorf("decoded %q %q %q, %v from %s", back.MX, back.MXAddr, back.Source, err, b)
		}
	}
	rec.MX, rec.MXAddr, rec.Source = "", "", ""
	js, _ = json.Marshal(rec)
	buf.Reset()
	rec.LogOutcome(zerolog.New(&buf), "deferred", nil)
	for _, b := range [][]byte{js, buf.Bytes()} {
		if bytes.Contains(b, []byte(`"mx":`)) || bytes.Contains(b, []byte(`"mx_addr":`)) || bytes.Contains(b, []byte(`"source":`)) {
			t.Errorf("empty where-fields written: %s", b)
		}
	}
}
