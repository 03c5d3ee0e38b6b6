package e2e

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestSubmitAndDeliverThroughRelay is the vertical slice: 100 messages
// submitted over SMTP AUTH from several connections are stored in the
// embedded JetStream and delivered through --relay to a fake MX, each exactly
// once and byte-for-byte intact (after the Received header outflow adds).
func TestSubmitAndDeliverThroughRelay(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none")

	const conns, perConn = 5, 20
	bodies := map[string][]byte{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
			defer cl.Close()
			for i := range perConn {
				id := fmt.Sprintf("m%d-%d", c, i)
				body := message(id, strings.Repeat("line of text "+id+"\r\n", i*7))
				mu.Lock()
				bodies["<"+id+"@e2e.test>"] = body
				mu.Unlock()
				if err := submit(cl, "app@sender.test", []string{"rcpt" + id + "@dest.test"}, body); err != nil {
					errs <- fmt.Errorf("submit %s: %w", id, err)
					return
				}
			}
			_ = cl.Quit()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := mx.WaitForMessages(conns*perConn, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	got := mx.Messages()
	if len(got) != conns*perConn {
		t.Fatalf("received %d messages, want %d", len(got), conns*perConn)
	}
	seen := map[string]int{}
	for _, m := range got {
		var id string
		for _, line := range strings.Split(string(m.Data), "\r\n") {
			if v, ok := strings.CutPrefix(line, "Message-ID: "); ok {
				id = v
				break
			}
		}
		seen[id]++
		want, ok := bodies[id]
		if !ok {
			t.Fatalf("unexpected message %q", id)
		}
		if !bytes.HasSuffix(m.Data, want) {
			t.Errorf("body of %s changed in transit", id)
		}
		if !bytes.HasPrefix(m.Data, []byte("Received: ")) {
			t.Errorf("%s has no Received trace header", id)
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	d.Stop()
}

// TestRestartDeliversQueuedMail stops the daemon while its relay is down,
// starts it again with the relay up, and expects every accepted message.
func TestRestartDeliversQueuedMail(t *testing.T) {
	dir := t.TempDir()
	users := writeUsers(t, dir)
	down := freeAddr(t)
	fast := []string{"--retry-base", "100ms", "--retry-min", "50ms", "--retry-cap", "500ms", "--relay-tls", "none"}
	d := startDaemon(t, dir+"/data", append([]string{"--users", users, "--relay", down}, fast...)...)
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	const n = 20
	for i := range n {
		if err := submit(cl, "app@sender.test", []string{"r@dest.test"}, message(fmt.Sprintf("r%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	_ = cl.Quit()
	// The relay is down: deferrals must have been logged before we stop.
	waitFor(t, 30*time.Second, "a deferral", func() bool { return strings.Contains(d.Logs(), `"lane":"retry"`) })
	d.Stop()

	mx := fakemx.Start(t, fakemx.Options{})
	d2 := startDaemon(t, dir+"/data", append([]string{"--users", users, "--relay", mx.Addr()}, fast...)...)
	if err := mx.WaitForMessages(n, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d2.Logs())
	}
	for id, c := range messageIDs(bodiesOf(mx.Messages())) {
		if c != 1 {
			t.Errorf("%s delivered %d times", id, c)
		}
	}
	if got := len(mx.Messages()); got != n {
		t.Fatalf("delivered %d, want %d", got, n)
	}
	d2.Stop()
}

func bodiesOf(ms []fakemx.Message) [][]byte {
	out := make([][]byte, len(ms))
	for i, m := range ms {
		out[i] = m.Data
	}
	return out
}
