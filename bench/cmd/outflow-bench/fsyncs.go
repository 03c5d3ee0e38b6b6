package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Counting fsyncs two ways. In a timed run, outflow's own count:
// outflow_store_fsyncs_total on /metrics, read before and after (exact for
// the group commit, free; the server's own fsyncs are not in it, and with
// --durability none there is no group commit to count). In a separate,
// untimed run, every fsync-family call of a system's processes:
// `strace -f -c -e trace=fsync,fdatasync` attached to them, which counts
// nats-server's and Postfix's alike but slows what it traces.

// metricValue sums the samples of the metric name (any labels) on the
// /metrics page at addr; ok is false when the page has none.
func metricValue(httpAddr, name string) (v float64, ok bool, err error) {
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	v, ok = parseMetric(resp.Body, name)
	return v, ok, nil
}

// parseMetric sums the samples of name in a Prometheus text page.
func parseMetric(r io.Reader, name string) (sum float64, ok bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var val string
		if rest, found := strings.CutPrefix(line, name+" "); found {
			val = rest
		} else if strings.HasPrefix(line, name+"{") {
			_, val, _ = strings.Cut(line[len(name):], "} ")
		}
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		if x, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += x
			ok = true
		}
	}
	return sum, ok
}

// straceFsyncs runs fn with strace attached to pids (and, -f, to every
// thread and child they have or start) and returns the fsync and fdatasync
// calls it counted. It fails if strace is missing or cannot attach.
func straceFsyncs(pids []int, fn func() error) (int, error) {
	bin, err := exec.LookPath("strace")
	if err != nil {
		return 0, fmt.Errorf("strace not found (make deps installs it): %w", err)
	}
	dir, err := os.MkdirTemp("", "outflow-bench-strace-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "summary")
	args := []string{"-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out}
	for _, p := range pids {
		args = append(args, "-p", strconv.Itoa(p))
	}
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("strace: %w", err)
	}
	// strace reports each process it attached to on stderr; start the
	// load once every pid is traced.
	attached := make(chan error, 1)
	var msgs bytes.Buffer
	go func() {
		sc := bufio.NewScanner(stderr)
		n := 0
		for sc.Scan() {
			msgs.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "attached") {
				if n++; n == len(pids) {
					attached <- nil
				}
			}
		}
		attached <- fmt.Errorf("strace ended after attaching %d of %d processes: %s", n, len(pids), strings.TrimSpace(msgs.String()))
		_, _ = io.Copy(io.Discard, stderr)
	}()
	select {
	case err := <-attached:
		if err != nil {
			_ = cmd.Wait()
			return 0, err
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return 0, fmt.Errorf("strace did not attach within 30s")
	}
	runErr := fn()
	_ = cmd.Process.Signal(syscall.SIGINT) // detach and write the summary
	_ = cmd.Wait()
	if runErr != nil {
		return 0, runErr
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return 0, fmt.Errorf("strace summary: %w", err)
	}
	return straceCalls(b), nil
}

// straceCalls adds up the calls column of strace -c's summary for fsync
// and fdatasync: "% time seconds usecs/call calls [errors] syscall".
func straceCalls(summary []byte) int {
	n := 0
	for _, line := range strings.Split(string(summary), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || (f[len(f)-1] != "fsync" && f[len(f)-1] != "fdatasync") {
			continue
		}
		if c, err := strconv.Atoi(f[3]); err == nil {
			n += c
		}
	}
	return n
}

// fsyncCount is one straced run: sessions of smtp-source send msgs
// messages of size bytes through sys while strace counts its fsyncs; it
// returns fsyncs per message.
func fsyncCount(sys system, msgs, size int) (float64, error) {
	if sys.pids == nil {
		return 0, fmt.Errorf("%s: no processes to trace", sys.name)
	}
	sk := newSink(freePort())
	if err := sk.Start(); err != nil {
		return 0, err
	}
	defer sk.Stop()
	addr, stop, err := sys.start(sk.addr)
	if err != nil {
		return 0, err
	}
	defer stop()
	n, err := straceFsyncs(sys.pids(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		if _, err := smtpSource(ctx, addr, 20, msgs, size); err != nil {
			return err
		}
		_, err := sk.WaitCount(int64(msgs), 15*time.Minute)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", sys.name, err)
	}
	return float64(n) / float64(msgs), nil
}
