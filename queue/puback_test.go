package queue

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pubAckErr accepts the server's success replies without a decode, and
// reads every other reply as nats.go's publish does.
func TestPubAckErr(t *testing.T) {
	ok := func(d string) *nats.Msg { return &nats.Msg{Data: []byte(d)} }
	for _, c := range []struct {
		name string
		m    *nats.Msg
		err  bool
	}{
		{"success", ok(`{"stream":"KV_outflow_sent","seq":12}`), false},
		{"domain", ok(`{"stream":"KV_outflow_sent","domain":"hub","seq":12}`), false},
		{"duplicate", ok(`{"stream":"KV_outflow_sent","seq":12,"duplicate":true}`), false},
		{"other order", ok(`{"seq":12,"stream":"KV_outflow_sent"}`), false},
		{"error", ok(`{"error":{"code":503,"err_code":10077,"description":"resource limits exceeded for account"},"stream":"KV_outflow_sent","seq":0}`), true},
		{"error after the stream", ok(`{"stream":"KV_outflow_sent","seq":0,"error":{"code":500,"description":"x"}}`), true},
		{"other stream", ok(`{"stream":"KV_outflow_sent2","seq":12}`), true},
		{"other stream, same prefix", ok(`{"stream":"KV_outflow","seq":12}`), true},
		{"no stream", ok(`{"seq":12}`), true},
		{"not json", ok(`+OK`), true},
		{"empty", ok(``), true},
		{"no responders", &nats.Msg{Header: nats.Header{"Status": []string{"503"}}}, true},
		{"other status", &nats.Msg{Header: nats.Header{"Status": []string{"408"}, "Description": []string{"Request Timeout"}}}, true},
	} {
		err := pubAckErr(c.m, sentStreamName)
		if (err != nil) != c.err {
			t.Errorf("%s: err = %v, want error %v", c.name, err, c.err)
		}
	}
	if err := pubAckErr(&nats.Msg{Header: nats.Header{"Status": []string{"503"}}}, StreamEvents); !errors.Is(err, jetstream.ErrNoStreamResponse) || !transient(err) {
		t.Errorf("no responders: %v, want the transient ErrNoStreamResponse", err)
	}
	var apiErr *jetstream.APIError
	if err := pubAckErr(ok(`{"error":{"code":400,"err_code":10060,"description":"expected stream does not match"}}`), StreamWork); !errors.As(err, &apiErr) || apiErr.ErrorCode != 10060 {
		t.Errorf("API error: %v", err)
	}
}

// The key check is KeyValue.Put's.
func TestValidKVKey(t *testing.T) {
	for k, want := range map[string]bool{"abc.1": true, "a-b_c/d=e.F9": true, "": false, ".a": false, "a.": false, "a b": false, "a*": false, "a>": false, "é": false} {
		if got := validKVKey(k); got != want {
			t.Errorf("validKVKey(%q) = %v", k, got)
		}
	}
}

// putSent stores what KeyValue.Put stores, and reports the server's errors.
func TestPutSentLikeKeyValuePut(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := q.putSent(ctx, "m1.0", []byte("a@b.example")); err != nil {
		t.Fatal(err)
	}
	ent, err := q.sent.Get(ctx, "m1.0")
	if err != nil || string(ent.Value()) != "a@b.example" || ent.Operation() != jetstream.KeyValuePut {
		t.Fatalf("Get after putSent: %v, %v", ent, err)
	}
	if err := q.putSent(ctx, "m1.0", []byte("c@d.example")); err != nil {
		t.Fatal(err)
	}
	if ent2, err := q.sent.Get(ctx, "m1.0"); err != nil || string(ent2.Value()) != "c@d.example" || ent2.Revision() <= ent.Revision() {
		t.Fatalf("second putSent: %v, %v", ent2, err)
	}
	if err := q.putSent(ctx, "bad key", nil); !errors.Is(err, jetstream.ErrInvalidKey) {
		t.Fatalf("invalid key: %v", err)
	}
	// A publish the stream refuses (its stream name expected wrongly).
	m := &nats.Msg{Subject: sentSubject("m2.0"), Header: nats.Header{jetstream.ExpectedStreamHeader: []string{"OTHER"}}}
	if err := q.publishConfirmed(ctx, m, sentStreamName); err == nil {
		t.Fatal("refused publish: no error")
	}
	// No stream on the subject.
	if err := q.publishConfirmed(ctx, &nats.Msg{Subject: "outflow.nostream.x"}, "NONE"); !transient(err) {
		t.Fatalf("no stream: %v, want a transient error", err)
	}
}

// go test -run '^$' -bench SentPut -benchmem -count 3 ./queue
//
// The SENT marker's write (the embedded server's CPU included):
// KeyValue.Put as before, and putSent.
func BenchmarkSentPut(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	val := []byte("x@example.com")
	b.Run("KeyValue.Put", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		i := 0
		for b.Loop() {
			i++
			if _, err := q.sent.Put(ctx, "k"+strconv.Itoa(i)+".0", val); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("putSent", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		i := 0
		for b.Loop() {
			i++
			if err := q.putSent(ctx, "p"+strconv.Itoa(i)+".0", val); err != nil {
				b.Fatal(err)
			}
		}
	})
}
