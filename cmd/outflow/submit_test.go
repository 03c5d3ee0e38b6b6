package main

import (
	"bytes"
	"context"
	"net/mail"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/bounce"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// TestSubmitDSN: --ret, --envid, --notify and --orcpt become the envelope's
// DSN parameters in the SMTP listener's form, and a bad value is refused
// with the listener's reason.
func TestSubmitDSN(t *testing.T) {
	to := []string{"ann@one.example", "b=x@two.example"}
	d, err := submitDSN("hdrs", "order 42", []string{"ann@one.example=success,failure", "b=x@two.example=NEVER"},
		[]string{"ann@one.example=rfc822;ann@old.example"}, to)
	if err != nil {
		t.Fatal(err)
	}
	want := &queue.DSNParams{Ret: "HDRS", EnvID: "order 42", Rcpts: map[string]queue.RcptDSN{
		"ann@one.example": {Notify: []string{"SUCCESS", "FAILURE"}, ORcpt: "ann@old.example"},
		"b=x@two.example": {Notify: []string{"NEVER"}},
	}}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("got %+v, want %+v", d, want)
	}
	if d, err := submitDSN("", "", nil, nil, to); d != nil || err != nil {
		t.Fatalf("no flags: %+v, %v", d, err)
	}
	for _, c := range []struct {
		ret, envID    string
		notify, orcpt []string
		wantInMessage string
	}{
		{"ALL", "", nil, nil, "RET must be FULL or HDRS"},
		{"", strings.Repeat("e", 101), nil, nil, "ENVID longer than 100"},
		{"", "", []string{"ann@one.example=NEVER,DELAY"}, nil, "NOTIFY=NEVER cannot be combined"},
		{"", "", []string{"ann@one.example=SOMETIMES"}, nil, "NOTIFY must be NEVER"},
		{"", "", []string{"carl@one.example=NEVER"}, nil, "RCPT one of --to"},
		{"", "", nil, []string{"ann@one.example=ann@old.example"}, "ORCPT must be addr-type;address"},
	} {
		if _, err := submitDSN(c.ret, c.envID, c.notify, c.orcpt, to); err == nil || !strings.Contains(err.Error(), c.wantInMessage) {
			t.Errorf("submitDSN(%q, %q, %v, %v) = %v, want %q", c.ret, c.envID, c.notify, c.orcpt, err, c.wantInMessage)
		}
	}
}

// TestSubmitStoresDSN: `outflow submit` against a running queue stores
// its DSN flags on the envelope.
func TestSubmitStoresDSN(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	rootCmd.SetIn(strings.NewReader("Subject: hi\n\nhello\n"))
	if err := execRoot(ctx, nil, "submit", "--data", dir, "--from", "app@src.example", "--to", "ann@one.example",
		"--ret", "full", "--envid", "e-1", "--notify", "ann@one.example=SUCCESS", "--orcpt", "ann@one.example=rfc822;ann@old.example"); err != nil {
		t.Fatal(err)
	}
	items, err := q.List(ctx, queue.Filter{State: queue.StateQueued})
	if err != nil || len(items) != 1 {
		t.Fatalf("queued %d, %v", len(items), err)
	}
	want := &queue.DSNParams{Ret: "FULL", EnvID: "e-1", Rcpts: map[string]queue.RcptDSN{
		"ann@one.example": {Notify: []string{"SUCCESS"}, ORcpt: "ann@old.example"}}}
	if got := items[0].Env.DSN; !reflect.DeepEqual(got, want) {
		t.Fatalf("stored DSN %+v, want %+v", got, want)
	}
	// The bare message is stored under a trace field, with the From,
	// Date and Message-ID it lacked.
	it, err := q.Find(ctx, items[0].Env.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := q.EnvelopeBody(ctx, it.Env)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("Received: by ")) || !bytes.Contains(b, []byte("(outflow submit, from userid ")) {
		t.Fatalf("no Received field on top: %q", b)
	}
	m, err := mail.ReadMessage(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%v: %q", err, b)
	}
	if _, err := m.Header.Date(); err != nil || m.Header.Get("Message-ID") == "" || m.Header.Get("Subject") != "hi" ||
		m.Header.Get("From") != "<app@src.example>" {
		t.Fatalf("stored header %v (date: %v)", m.Header, err)
	}
}

// TestSubmitSplitsForReturnPaths: once the fleet has made its return-path
// key (serve does, at start, when some tenant's mail goes out with a
// return path), `outflow submit` gives each recipient an envelope of its
// own, as serve does for such a tenant, so that no return path is shared
// by two recipients. Before, it keeps one envelope per domain.
func TestSubmitSplitsForReturnPaths(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	submit := func() []string {
		t.Helper()
		var out bytes.Buffer
		rootCmd.SetIn(strings.NewReader("Subject: hi\n\nhello\n"))
		if err := execRoot(ctx, &out, "submit", "--data", dir, "--from", "app@src.example",
			"--to", "ann@one.example", "--to", "bob@one.example"); err != nil {
			t.Fatal(err)
		}
		return strings.Fields(out.String())
	}
	rcptsOf := func(ids []string) [][]string {
		t.Helper()
		var out [][]string
		for _, id := range ids {
			it, err := q.Find(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, it.Env.Rcpts)
		}
		return out
	}

	if got := rcptsOf(submit()); !reflect.DeepEqual(got, [][]string{{"ann@one.example", "bob@one.example"}}) {
		t.Fatalf("without return paths: envelopes of %v, want one of both", got)
	}
	if _, err := bounce.LoadKey(ctx, q); err != nil {
		t.Fatal(err)
	}
	if got := rcptsOf(submit()); !reflect.DeepEqual(got, [][]string{{"ann@one.example"}, {"bob@one.example"}}) {
		t.Fatalf("with return paths: envelopes of %v, want one per recipient", got)
	}
}
