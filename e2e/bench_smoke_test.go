package e2e

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// TestBenchSmoke is a short version of benchmark scenario 1
// (docs/benchmarks.md): Postfix's smtp-source sends 2,000 messages over 10
// sessions through outflow, which relays them to Postfix's smtp-sink. It
// asserts only that every message arrived, never a speed: `make bench`
// measures speed.
func TestBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end smoke benchmark; skipped with -short")
	}
	source, sinkBin := postfixTool(t, "smtp-source"), postfixTool(t, "smtp-sink")
	const msgs, sessions = 2000, 10

	sinkAddr := freeAddr(t)
	args := []string{"-c"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody") // smtp-sink will not run as root
	}
	sink := exec.Command(sinkBin, append(args, sinkAddr, "256")...)
	out, err := sink.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.Process.Kill(); _ = sink.Wait() })
	var arrived atomic.Int64
	go func() {
		// smtp-sink -c rewrites "sess=N quit=N mesg=N" after each event,
		// separated by carriage returns.
		r := bufio.NewReader(out)
		for {
			tok, err := r.ReadSlice('\r')
			if i := bytes.LastIndex(tok, []byte("mesg=")); i >= 0 {
				if n, perr := strconv.ParseInt(string(bytes.TrimRight(tok[i+5:], "\r\n ")), 10, 64); perr == nil {
					arrived.Store(n)
				}
			}
			if err != nil && err != bufio.ErrBufferFull {
				return
			}
		}
	}()

	d := startDaemon(t, t.TempDir(), "--relay", sinkAddr, "--relay-tls", "none", "--trusted-networks", "127.0.0.0/8")
	cmd := exec.Command(source, "-s", strconv.Itoa(sessions), "-m", strconv.Itoa(msgs), "-l", "2048",
		"-f", "bench@source.test", "-t", "rcpt@example.com", d.SMTPAddr)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("smtp-source: %v: %s\n%s", err, b, d.Logs())
	}
	deadline := time.Now().Add(3 * time.Minute)
	for arrived.Load() < msgs {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages reached smtp-sink after 3 minutes\n%s", arrived.Load(), msgs, d.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // let a duplicate, if any, arrive too
	if n := arrived.Load(); n != msgs {
		t.Fatalf("smtp-sink counted %d messages, want exactly %d", n, msgs)
	}
	d.Stop()
}

// postfixTool finds one of Postfix's test tools (Debian package postfix).
func postfixTool(t *testing.T, name string) string {
	t.Helper()
	return debianTool(t, name, "postfix")
}
