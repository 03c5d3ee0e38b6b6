package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// Issue 24: a 250 means the envelope is on disk. The daemon is traced with
// strace while it accepts 200 sequential and 200 concurrent submissions,
// and the trace must show, for every 250, that an fsync of the work
// stream's block file holding the envelope started after the envelope's
// write had returned and had itself returned before the 250 was written.
// The same check run against --durability none (the old default, the
// server's two-minute sync) must find 250s without one.

// straceAvailable returns "" when strace can trace a child here, or why not.
func straceAvailable() string {
	bin, err := exec.LookPath("strace")
	if err != nil {
		return "strace not installed (make deps installs it)"
	}
	out, err := exec.Command(bin, "-f", "-qq", "-e", "trace=fsync", "true").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("strace cannot ptrace in this environment: %v: %s", err, bytes.TrimSpace(out))
	}
	return ""
}

func TestDurabilityEvery250FollowsAnFsync(t *testing.T) {
	if why := straceAvailable(); why != "" {
		t.Skip(why)
	}
	if !serveHasFlag("durability") {
		t.Skip("serve has no --durability flag")
	}
	for _, tc := range []struct {
		durability string
		wantSynced bool
	}{
		{"disk", true},
		{"none", false},
	} {
		t.Run(tc.durability, func(t *testing.T) {
			r := traceSubmissions(t, tc.durability)
			t.Logf("durability %s: %d 250s: %d after an fsync of their block, %d delivered and their block removed before it; %d fsyncs while submitting (%.2f per message)",
				tc.durability, r.replies, r.synced, r.removed, r.fsyncs, float64(r.fsyncs)/float64(max(r.replies, 1)))
			if r.replies != 400 {
				t.Fatalf("traced %d 250 replies to DATA, want 400", r.replies)
			}
			if tc.wantSynced && r.synced+r.removed != r.replies {
				t.Fatalf("%d of %d 250s were written before an fsync of the message's block had returned; first: %s",
					r.replies-r.synced-r.removed, r.replies, r.firstUnsynced)
			}
			if tc.wantSynced && r.synced < r.replies/2 {
				t.Fatalf("only %d of %d 250s followed an fsync", r.synced, r.replies)
			}
			if !tc.wantSynced && r.synced+r.removed == r.replies {
				t.Fatalf("with --durability none every 250 still followed an fsync: the check cannot tell the difference")
			}
		})
	}
}

// traceResult is what one traced run found.
type traceResult struct {
	replies       int    // 250 replies to DATA naming an envelope
	synced        int    // of those, preceded by an fsync of the envelope's block after its write
	removed       int    // of those, delivered so fast that their block was removed before the 250
	fsyncs        int    // fsync-family calls in the submission phase
	firstUnsynced string // an id whose 250 was not preceded by one
}

// traceSubmissions starts a daemon with --durability d, attaches strace,
// submits 200 messages one after another on one session and 200 over 50
// concurrent sessions, and checks the trace.
func traceSubmissions(t *testing.T, d string) traceResult {
	dir := t.TempDir()
	mx := fakemx.Start(t, fakemx.Options{})
	dmn := startDaemon(t, filepath.Join(dir, "data"), "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--durability", d)

	trace := filepath.Join(dir, "trace")
	st := exec.Command("strace", "-f", "-qq", "-y", "-s", "1048576", "-e", "trace=pwrite64,write,fsync,fdatasync,sync_file_range,unlinkat",
		"-o", trace, "-p", strconv.Itoa(dmn.pid()))
	var stErr bytes.Buffer
	st.Stderr = &stErr
	if err := st.Start(); err != nil {
		t.Fatal(err)
	}
	stDone := make(chan error, 1)
	go func() { stDone <- st.Wait() }()
	var stopOnce sync.Once
	stopTrace := func() {
		stopOnce.Do(func() {
			_ = st.Process.Signal(syscall.SIGINT) // detaches and flushes the output
			select {
			case <-stDone:
			case <-time.After(30 * time.Second):
				_ = st.Process.Kill()
				<-stDone
			}
		})
	}
	defer stopTrace()

	// Attached once a NOOP's reply shows up in the trace.
	c := dialAuth(t, dmn.SMTPAddr, testUser, testPassword)
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := c.Noop(); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(trace); bytes.Contains(b, []byte(`"250 2.0.0`)) {
			break
		}
		select {
		case err := <-stDone:
			stDone <- err // for stopTrace
			if strings.Contains(stErr.String(), "Operation not permitted") {
				t.Skipf("strace cannot attach here: %s", strings.TrimSpace(stErr.String()))
			}
			t.Fatalf("strace exited before tracing: %v: %s", err, stErr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("strace not tracing after 30s: %s", stErr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	for i := range 200 {
		if err := submit(c, "app@sender.test", []string{"rcpt@dest.test"}, message(fmt.Sprintf("seq-%d-%s", i, d), "")); err != nil {
			t.Fatalf("sequential submission %d: %v", i, err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for s := range 50 {
		wg.Go(func() {
			cc, _, err := dialAuthNoFatal(dmn.SMTPAddr)
			if err != nil {
				errs <- err
				return
			}
			defer cc.Close()
			for i := range 4 {
				if err := submit(cc, "app@sender.test", []string{"rcpt@dest.test"}, message(fmt.Sprintf("conc-%d-%d-%s", s, i, d), "")); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent submission: %v", err)
	}
	stopTrace()
	f, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := checkTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	if keep := os.Getenv("OUTFLOW_KEEP_TRACE"); keep != "" {
		b, _ := os.ReadFile(trace)
		_ = os.WriteFile(keep+"."+d, b, 0o600)
	}
	return r
}

var (
	// 1234 pwrite64(12</…/OUTFLOW_WORK/msgs/1.blk>, "…"…, 300, 0) = 300
	// 1234 fsync(12</…/1.blk> <unfinished ...>
	// 1234 <... fsync resumed>) = 0
	traceCall    = regexp.MustCompile(`^(\d+)\s+(pwrite64|write|fsync|fdatasync|sync_file_range)\((\d+)<([^>]*)>(.*)$`)
	traceResumed = regexp.MustCompile(`^(\d+)\s+<\.\.\. (pwrite64|write|fsync|fdatasync|sync_file_range) resumed>(.*)$`)
	workSubject  = regexp.MustCompile(`outflow\.work\.[^.\\"]+\.[^.\\"]+\.([A-Za-z0-9]+)`)
	queuedAs     = regexp.MustCompile(`"250 2\.0\.0 OK: queued as ([A-Za-z0-9]+)`)
	// 1234 unlinkat(AT_FDCWD, "/…/OUTFLOW_WORK/msgs/9.blk", 0) = 0
	// (-y prints AT_FDCWD with the working directory: AT_FDCWD</dir>)
	traceUnlink = regexp.MustCompile(`^(\d+)\s+unlinkat\(AT_FDCWD(?:<[^>]*>)?, "([^"]+)"`)
)

// checkTrace reads an strace log in its order, which is the order in which
// strace saw the events: a complete line's call entered and returned
// before the next line's event, an unfinished one returned at its resumed
// line. A 250 counts as synced when an fsync of the block file that holds
// its envelope entered after that write returned and returned before the
// 250's write entered. A work-queue block is removed only once every
// envelope in it is acknowledged, so a 250 whose envelope's block was
// unlinked before it counts as removed: delivered already, nothing left to
// sync.
func checkTrace(f *os.File) (traceResult, error) {
	type pending struct {
		call, path, rest string
		at               int
	}
	type syncSpan struct {
		path      string
		from, end int
	}
	var (
		r       traceResult
		open    = map[string]pending{} // by pid
		written = map[string]struct {  // envelope id -> block and the event index its write returned at
			path string
			at   int
		}{}
		syncs    []syncSpan
		unlinked = map[string]int{} // path -> trace line index
	)
	isBlock := func(p string) bool {
		return strings.Contains(p, "/OUTFLOW_WORK/msgs/") && strings.HasSuffix(p, ".blk")
	}
	finish := func(p pending, end int) {
		switch p.call {
		case "pwrite64", "write":
			if isBlock(p.path) {
				for _, m := range workSubject.FindAllStringSubmatch(p.rest, -1) {
					written[m[1]] = struct {
						path string
						at   int
					}{p.path, end}
				}
			}
		default:
			syncs = append(syncs, syncSpan{p.path, p.at, end})
			r.fsyncs++
		}
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for i := 0; sc.Scan(); i++ {
		line := sc.Text()
		if m := traceResumed.FindStringSubmatch(line); m != nil {
			if p, ok := open[m[1]]; ok {
				delete(open, m[1])
				finish(p, i)
			}
			continue
		}
		if u := traceUnlink.FindStringSubmatch(line); u != nil && !strings.Contains(line, "= -1") {
			unlinked[u[2]] = i
			continue
		}
		m := traceCall.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		p := pending{call: m[2], path: m[4], rest: m[5], at: i}
		if m[2] == "write" && (strings.HasPrefix(p.path, "socket:") || strings.HasPrefix(p.path, "TCP")) {
			// A reply leaves at its entry.
			if q := queuedAs.FindStringSubmatch(p.rest); q != nil {
				r.replies++
				w, ok := written[q[1]]
				synced := false
				for _, s := range syncs {
					if ok && s.path == w.path && s.from > w.at && s.end < i {
						synced = true
						break
					}
				}
				gone, wasGone := unlinked[w.path]
				switch {
				case synced:
					r.synced++
				case ok && wasGone && gone > w.at:
					r.removed++
				case r.firstUnsynced == "":
					r.firstUnsynced = fmt.Sprintf("%s (its envelope's write returned at trace line %d, the 250 at line %d)", q[1], w.at+1, i+1)
				}
			}
			continue
		}
		if strings.HasSuffix(line, "<unfinished ...>") {
			open[m[1]] = p
			continue
		}
		finish(p, i)
	}
	return r, sc.Err()
}
