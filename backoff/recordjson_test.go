package backoff

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The hand-written encoder writes exactly what json.Marshal writes for the
// wire form.
func TestRecordAppendJSONMatchesMarshal(t *testing.T) {
	base := sampleRecord(time.Date(2025, 3, 4, 5, 6, 7, 123456789, time.FixedZone("x", 3600)))
	recs := []Record{base, {}}
	odd := base
	odd.Reply, odd.PacedBy, odd.Attempt = "550 <a@b> & \"q\" \\ \x00\x1f\u2028 ü \xff", "10.00/s learned", 0
	recs = append(recs, odd)
	waited := base
	waited.AdmitWaitMs, waited.Deliveries = 9999, 2
	recs = append(recs, waited)
	sent := base
	sent.MX, sent.MXAddr, sent.Source = "mx1.example.com", "[2001:db8::25]:25", "2001:db8::1"
	recs = append(recs, sent)
	for _, m := range []float64{0, 1.5, 2, 1e-7, 1e21, 123456789.125, -3.25e-9} {
		r := base
		r.Multiplier = m
		recs = append(recs, r)
	}
	for _, r := range recs {
		want, err := json.Marshal(r.wire())
		if err != nil {
			t.Fatal(err)
		}
		got, ok := r.AppendJSON(nil)
		if !ok || !bytes.Equal(got, want) {
			t.Errorf("AppendJSON = %s, %v\nwant         %s", got, ok, want)
		}
		if m, err := r.MarshalJSON(); err != nil || !bytes.Equal(m, want) {
			t.Errorf("MarshalJSON = %s, %v", m, err)
		}
	}
	bad := base
	bad.Multiplier = math.NaN()
	if got, ok := bad.AppendJSON([]byte("x")); ok || string(got) != "x" {
		t.Errorf("NaN multiplier: %q, %v", got, ok)
	}
	if _, err := bad.MarshalJSON(); err == nil {
		t.Error("NaN multiplier encoded")
	}
}

func FuzzRecordJSON(f *testing.F) {
	f.Add("01J", "t", "550 <a@b> & \"x\"", "4.7.28", 3, int64(2500), 1.5, uint64(1<<60), int64(1764651967123456789))
	f.Add("\xff", "\u2028", "\x00\n\t", "", -1, int64(-1), 1e-9, uint64(0), int64(0))
	f.Fuzz(func(t *testing.T, id, tenant, reply, enh string, attempt int, ms int64, mult float64, seed uint64, at int64) {
		r := Record{MsgID: id, Tenant: tenant, Reply: reply, EnhancedCode: enh, PacedBy: enh, Attempt: attempt, Code: attempt,
			Decision: Decision{Attempt: attempt, BaseMs: ms, DelayMs: -ms, Multiplier: mult, JitterSeed: seed}}
		if at != 0 {
			r.NextAttemptAt = time.Unix(0, at)
		}
		want, err := json.Marshal(r.wire())
		got, ok := r.AppendJSON(nil)
		if err != nil {
			if ok {
				t.Fatalf("json.Marshal refused (%v) but AppendJSON wrote %s", err, got)
			}
			return
		}
		if !ok || !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON = %s, %v\nwant         %s", got, ok, want)
		}
	})
}

// go test -run '^$' -bench RecordJSON -benchmem ./backoff
func BenchmarkRecordJSON(b *testing.B) {
	r := sampleRecord(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC))
	b.Run("AppendJSON", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 1024)
		for b.Loop() {
			if _, ok := r.AppendJSON(buf[:0]); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(r.wire()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// go test -run '^$' -bench LogOutcome -benchmem ./backoff: the decision
// line every attempt writes, without and with the recipients it names.
func BenchmarkLogOutcome(b *testing.B) {
	r := sampleRecord(time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC))
	l := zerolog.New(io.Discard)
	for _, tc := range []struct {
		name  string
		rcpts []string
	}{{"NoRcpts", nil}, {"OneRcpt", []string{"ann@example.net"}}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.LogOutcome(l, "delivered", tc.rcpts)
			}
		})
	}
}
