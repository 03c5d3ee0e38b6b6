package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// mountTmpfs mounts a tmpfs of size (e.g. "40m") on a fresh directory and
// unmounts it at cleanup; it skips the test if mounting is not permitted.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): %v %s", err, strings.TrimSpace(string(out)))
	}
	// Registered before the daemon starts, so it runs after the daemon is
	// killed (cleanups run last-in first-out).
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			_ = exec.Command("umount", "-l", dir).Run()
			t.Logf("umount %s: %v %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes path until the filesystem is full and returns how many
// bytes it wrote.
func fillDisk(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	for _, chunk := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, chunk)
		for {
			w, err := f.Write(buf)
			n += int64(w)
			if err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("fill %s: %v", path, err)
				}
				break
			}
		}
	}
	return n
}

// TestDiskFull runs the daemon with its data dir on a 40 MiB tmpfs, fills
// the filesystem, and expects every submission meanwhile to get a 451 (never
// a 250 for mail that could not be stored, and never a hang past the
// enqueue timeout); then frees the space and expects 250s and delivery
// again, of everything that was ever accepted.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	mnt := mountTmpfs(t, "40m")
	mx := fakemx.Start(t, fakemx.Options{})
	users := writeUsers(t, t.TempDir())
	data := filepath.Join(mnt, "data")
	d := startDaemon(t, data, append([]string{"--users", users, "--relay", mx.Addr()}, fastRetry...)...)

	accepted := map[string]bool{}
	codes := map[int]int{}
	try := func(d *daemon, id string, pad int) (int, time.Duration) {
		t.Helper()
		cl, _, err := dialAuthNoFatal(d.SMTPAddr)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer cl.Close()
		start := time.Now()
		err = submit(cl, "app@sender.test", []string{"r@dest.test"}, message(id, strings.Repeat("padding line\r\n", pad)))
		took := time.Since(start)
		code := 250
		if err != nil {
			var se *smtp.SMTPError
			if !errors.As(err, &se) {
				t.Errorf("submit %s: no SMTP reply after %v: %v", id, took, err)
				code = 0
			} else {
				code = se.Code
			}
		} else {
			accepted["<"+id+"@e2e.test>"] = true
		}
		codes[code]++
		return code, took
	}
	for i := range 5 {
		if c, _ := try(d, fmt.Sprintf("disk-before-%d", i), 100); c != 250 {
			t.Fatalf("submission before the disk filled: %d", c)
		}
	}
	waitAllDelivered(t, accepted, mx, 60*time.Second, d.Logs)

	filler := filepath.Join(mnt, "filler")
	filled := fillDisk(t, filler)
	t.Logf("filled the tmpfs with %d bytes", filled)
	fullReplies := map[int]int{}
	var slowest time.Duration
	fullTries := 2
	if longMode() {
		fullTries = 6
	}
	for i := range fullTries {
		c, took := try(d, fmt.Sprintf("disk-full-%d", i), 2000)
		fullReplies[c]++
		slowest = max(slowest, took)
		if c != 451 && c != 452 && c != 250 {
			t.Errorf("disk full: submission %d got %d, want 451", i, c)
		}
		if took > 45*time.Second {
			t.Errorf("disk full: the reply took %v (enqueue timeout is 30s)", took)
		}
	}
	if fullReplies[451]+fullReplies[452] == 0 {
		t.Errorf("no 451 while the disk was full (replies %v): the test did not reach a full disk", fullReplies)
	}
	if !d.alive() {
		t.Fatalf("the daemon died on a full disk\n%s", tail(d.Logs(), 40))
	}

	// Space returns: submissions must be accepted and delivered again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	recovered := false
	deadline := time.Now().Add(45 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if c, _ := try(d, fmt.Sprintf("disk-after-%d", i), 100); c == 250 {
			recovered = true
			break
		}
		time.Sleep(500 * time.Millisecond) // polling for recovery with a deadline
	}
	if !recovered {
		// nats-server shuts JetStream down when the disk fills; the
		// daemon's supervisor must start it again once there is room.
		t.Fatalf("no 250 within 45s after space returned (codes %v)\n%s", codes, tail(d.Logs(), 40))
	}
	for i := range 5 {
		if c, _ := try(d, fmt.Sprintf("disk-after-ok-%d", i), 100); c != 250 {
			t.Errorf("after recovery: %d", c)
		}
	}
	waitAllDelivered(t, accepted, mx, 90*time.Second, d.Logs)
	r := compare(accepted, sinkCounts(mx))
	t.Logf("FIGURES disk: filled=%dB while_full=%v slowest_reply=%v recovered_without_restart=%v overall_codes=%v %s",
		filled, fullReplies, slowest.Round(time.Millisecond), recovered, codes, r)
	if r.missing != 0 || r.dups != 0 {
		t.Errorf("after a full disk: %s", r)
	}
	requireNoPanic(t, d.Logs())
	d.Stop()
}
