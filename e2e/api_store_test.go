package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestHTTPAPIDiskFull runs the daemon with its data dir on a small tmpfs
// and fills it: while the store cannot take mail, POST /v1/messages answers
// 503 with a store-unavailable problem (never 202), within the enqueue
// timeout, and the process keeps serving; once space returns it answers
// 202 again, and every message that got a 202 is delivered.
func TestHTTPAPIDiskFull(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, "40m")
	mx := fakemx.Start(t, fakemx.Options{})
	data := filepath.Join(mnt, "data")
	d := startDaemon(t, data, append([]string{"--users", writeUsers(t, t.TempDir()), "--relay", mx.Addr()}, fastRetry...)...)
	key := adminCLI(t, data, "apikey", "create", "--tenant", "shop")

	accepted := map[string]bool{} // subjects that got a 202
	post := func(subject string, pad int) (int, map[string]any, time.Duration) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"from": "app@shop.test", "to": []string{"r@dest.test"}, "subject": subject,
			"text": strings.Repeat("padding line\n", pad)})
		req, _ := http.NewRequest("POST", "http://"+d.APIAddr+"/v1/messages", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		start := time.Now()
		res, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("POST %s: no answer after %v: %v", subject, time.Since(start), err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		var p map[string]any
		_ = json.Unmarshal(raw, &p)
		if res.StatusCode == http.StatusAccepted {
			accepted[subject] = true
		} else if res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("POST %s: %d with Content-Type %q: %s", subject, res.StatusCode, res.Header.Get("Content-Type"), raw)
		}
		return res.StatusCode, p, time.Since(start)
	}
	for i := range 3 {
		if c, p, _ := post(fmt.Sprintf("api-disk-before-%d", i), 100); c != http.StatusAccepted {
			t.Fatalf("before the disk filled: %d %v", c, p)
		}
	}

	filler := filepath.Join(mnt, "filler")
	t.Logf("filled the tmpfs with %d bytes", fillDisk(t, filler))
	codes := map[int]int{}
	for i := range 3 {
		c, p, took := post(fmt.Sprintf("api-disk-full-%d", i), 2000)
		codes[c]++
		switch c {
		case http.StatusServiceUnavailable:
			if p["type"] != "urn:outflow:problem:store-unavailable" {
				t.Errorf("disk full: 503 with problem %v", p)
			}
		case http.StatusAccepted: // stored before the disk ran out; it must be delivered
		default:
			t.Errorf("disk full: POST %d got %d %v, want 503", i, c, p)
		}
		if took > 45*time.Second {
			t.Errorf("disk full: the answer took %v (enqueue timeout is 30s)", took)
		}
	}
	if codes[http.StatusServiceUnavailable] == 0 {
		t.Errorf("no 503 while the disk was full (codes %v): the test did not reach a full disk", codes)
	}
	if !d.alive() {
		t.Fatalf("the daemon died on a full disk\n%s", tail(d.Logs(), 40))
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	recovered := false
	for i, deadline := 0, time.Now().Add(60*time.Second); time.Now().Before(deadline); i++ {
		if c, _, _ := post(fmt.Sprintf("api-disk-after-%d", i), 100); c == http.StatusAccepted {
			recovered = true
			break
		}
		time.Sleep(500 * time.Millisecond) // polling for recovery with a deadline
	}
	if !recovered {
		t.Fatalf("no 202 within 60s after space returned\n%s", tail(d.Logs(), 40))
	}
	waitFor(t, 90*time.Second, "every 202 delivered", func() bool {
		seen := map[string]bool{}
		for _, m := range mx.Messages() {
			for s := range accepted {
				if bytes.Contains(m.Data, []byte("Subject: "+s+"\r\n")) {
					seen[s] = true
				}
			}
		}
		return len(seen) == len(accepted)
	})
	t.Logf("FIGURES api disk: while_full=%v accepted=%d", codes, len(accepted))
	requireNoPanic(t, d.Logs())
}

// adminCLI runs an admin verb against the daemon of data dir and returns
// its stdout, trimmed. A run whose NATS handshake timed out on a loaded
// machine never reached the daemon, so it is run again (up to 3 times).
func adminCLI(t *testing.T, data string, args ...string) string {
	t.Helper()
	for try := 1; ; try++ {
		var out, errb bytes.Buffer
		cmd := exec.Command(binary, append(args, "--data", data)...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err == nil {
			return strings.TrimSpace(out.String())
		}
		if try < 3 && strings.Contains(errb.String(), "timeout") {
			continue
		}
		t.Fatalf("outflow %v: %v\n%s%s", args, err, out.String(), errb.String())
	}
}
