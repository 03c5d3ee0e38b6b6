package faultfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mount mounts a fresh backing dir and unmounts it at cleanup, also when
// the test fails.
func mount(t *testing.T, opts Options) (backing, mnt string, f *FS) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("FUSE not available here: %v", err)
	}
	dir := t.TempDir()
	backing, mnt = filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	for _, d := range []string{backing, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	f, err := Mount(backing, mnt, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return backing, mnt, f
}

func tcheck(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func writeAt(t *testing.T, f *os.File, s string, off int64) {
	t.Helper()
	_, err := f.WriteAt([]byte(s), off)
	tcheck(t, err, "write "+f.Name())
}

func readBacking(t *testing.T, backing, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(backing, name))
	tcheck(t, err, "read backing "+name)
	return string(b)
}

func TestCrashKeepsOnlyWhatWasSynced(t *testing.T) {
	backing, mnt, ffs := mount(t, Options{PowerLoss: true})
	open := func(name string, flags int) *os.File {
		f, err := os.OpenFile(filepath.Join(mnt, name), flags|os.O_RDWR|os.O_CREATE, 0o644)
		tcheck(t, err, "open "+name)
		t.Cleanup(func() { f.Close() })
		return f
	}

	// appended: synced part stays, the rest vanishes.
	a := open("appended", 0)
	writeAt(t, a, "durable;", 0)
	tcheck(t, a.Sync(), "fsync")
	writeAt(t, a, "lost", 8)

	// never synced: the file stays (namespace is durable), empty.
	writeAt(t, open("unsynced", 0), "all lost", 0)

	// overwritten in the middle and extended: the original comes back.
	o := open("overwritten", 0)
	orig := bytes.Repeat([]byte("0123456789"), 1000) // 10,000 bytes, 3 pages
	_, err := o.WriteAt(orig, 0)
	tcheck(t, err, "write")
	tcheck(t, o.Sync(), "fsync")
	writeAt(t, o, "XXXXXXXX", 4090) // across a page boundary
	writeAt(t, o, "tail", 20000)

	// truncated (ftruncate, then O_TRUNC of an open): contents come back.
	tr := open("truncated", 0)
	writeAt(t, tr, "keep me", 0)
	tcheck(t, tr.Sync(), "fsync")
	tcheck(t, tr.Truncate(2), "truncate")
	o2 := open("otrunc", 0)
	writeAt(t, o2, "keep me too", 0)
	tcheck(t, o2.Sync(), "fsync")
	open("otrunc", os.O_TRUNC)

	// fdatasync counts like fsync.
	ds := open("datasynced", 0)
	writeAt(t, ds, "durable too", 0)
	tcheck(t, syscall.Fdatasync(int(ds.Fd())), "fdatasync")

	// O_SYNC: every write is durable when it returns.
	writeAt(t, open("osync", os.O_SYNC), "sync write", 0)

	// A temp file renamed over a synced one without its own fsync: the
	// rename is durable, the temp file's contents are not.
	tgt := open("target", 0)
	writeAt(t, tgt, "old target", 0)
	tcheck(t, tgt.Sync(), "fsync")
	tmp := open("target.tmp", 0)
	writeAt(t, tmp, "new target", 0)
	tcheck(t, os.Rename(filepath.Join(mnt, "target.tmp"), filepath.Join(mnt, "target")), "rename")

	// Until the crash everything reads back as written.
	if got, _ := os.ReadFile(filepath.Join(mnt, "appended")); string(got) != "durable;lost" {
		t.Fatalf("before the crash: %q", got)
	}
	st := ffs.Stats()
	if st.UnsyncedFiles == 0 || st.UndoBytes == 0 {
		t.Fatalf("stats before the crash: %+v", st)
	}

	files, err := ffs.Crash()
	tcheck(t, err, "crash")
	if files < 5 {
		t.Errorf("crash rolled back %d files, want at least 5", files)
	}
	// After the crash every change fails.
	if _, err := a.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EIO) {
		t.Errorf("write after crash: %v, want EIO", err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "newdir"), 0o755); !errors.Is(err, syscall.EIO) {
		t.Errorf("mkdir after crash: %v, want EIO", err)
	}

	want := map[string]string{
		"appended":    "durable;",
		"unsynced":    "",
		"overwritten": string(orig),
		"truncated":   "keep me",
		"otrunc":      "keep me too",
		"datasynced":  "durable too",
		"osync":       "sync write",
		"target":      "",
	}
	for name, w := range want {
		if got := readBacking(t, backing, name); got != w {
			t.Errorf("%s after crash: %d bytes %.40q, want %d bytes %.40q", name, len(got), got, len(w), w)
		}
	}
	if _, err := os.Stat(filepath.Join(backing, "target.tmp")); !os.IsNotExist(err) {
		t.Errorf("target.tmp after crash: %v, want gone (renamed)", err)
	}
	if st := ffs.Stats(); st.UnsyncedFiles != 0 || st.UndoBytes != 0 {
		t.Errorf("stats after the crash: %+v", st)
	}
}

// An fsync covers what was written before it was called, not what is
// written while it runs; a crash during an fsync keeps nothing of it.
func TestFsyncCoversWritesBeforeItOnly(t *testing.T) {
	const delay = 300 * time.Millisecond
	backing, mnt, ffs := mount(t, Options{PowerLoss: true, FsyncDelay: delay})
	f, err := os.OpenFile(filepath.Join(mnt, "f"), os.O_RDWR|os.O_CREATE, 0o644)
	tcheck(t, err, "create")
	defer f.Close()
	writeAt(t, f, "before;", 0)

	done := make(chan error, 1)
	go func() { done <- f.Sync() }()
	deadline := time.Now().Add(10 * time.Second)
	for ffs.Stats().Fsyncs < 1 { // the fsync is in its delay
		if time.Now().After(deadline) {
			t.Fatal("fsync never reached the filesystem")
		}
		time.Sleep(5 * time.Millisecond)
	}
	writeAt(t, f, "during", 7)
	tcheck(t, <-done, "fsync")

	g, err := os.OpenFile(filepath.Join(mnt, "g"), os.O_RDWR|os.O_CREATE, 0o644)
	tcheck(t, err, "create")
	defer g.Close()
	writeAt(t, g, "never durable", 0)
	gdone := make(chan error, 1)
	before := ffs.Stats().Fsyncs
	go func() { gdone <- g.Sync() }()
	for ffs.Stats().Fsyncs == before {
		if time.Now().After(deadline) {
			t.Fatal("second fsync never reached the filesystem")
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, err = ffs.Crash() // while g's fsync sleeps
	tcheck(t, err, "crash")
	if err := <-gdone; !errors.Is(err, syscall.EIO) {
		t.Errorf("fsync cut by the crash: %v, want EIO", err)
	}
	if got := readBacking(t, backing, "f"); got != "before;" {
		t.Errorf("f after crash: %q, want %q", got, "before;")
	}
	if got := readBacking(t, backing, "g"); got != "" {
		t.Errorf("g after crash: %q, want empty", got)
	}
}

func TestFsyncDelayIsObserved(t *testing.T) {
	const delay = 200 * time.Millisecond
	_, mnt, ffs := mount(t, Options{FsyncDelay: delay})
	f, err := os.Create(filepath.Join(mnt, "f"))
	tcheck(t, err, "create")
	defer f.Close()
	writeAt(t, f, "x", 0)
	d, err := os.Open(mnt)
	tcheck(t, err, "open dir")
	defer d.Close()

	timed := func(what string, fn func() error) time.Duration {
		t.Helper()
		start := time.Now()
		tcheck(t, fn(), what)
		return time.Since(start)
	}
	for what, fn := range map[string]func() error{
		"fsync":           f.Sync,
		"fdatasync":       func() error { return syscall.Fdatasync(int(f.Fd())) },
		"directory fsync": d.Sync,
	} {
		if took := timed(what, fn); took < delay {
			t.Errorf("%s took %v, want at least %v", what, took, delay)
		}
	}
	// Concurrent fsyncs of different files each wait their delay, in
	// parallel. (The kernel serialises fsyncs of one file.)
	var files []*os.File
	for i := range 4 {
		g, err := os.Create(filepath.Join(mnt, fmt.Sprint("p", i)))
		tcheck(t, err, "create")
		defer g.Close()
		files = append(files, g)
	}
	var wg sync.WaitGroup
	start := time.Now()
	for _, g := range files {
		wg.Add(1)
		go func() { defer wg.Done(); _ = g.Sync() }()
	}
	wg.Wait()
	// One after another they would take 4 delays; the slack is for a
	// loaded machine.
	if took := time.Since(start); took < delay || took >= 4*delay {
		t.Errorf("4 parallel fsyncs took %v, want between %v and %v", took, delay, 4*delay)
	}
	ffs.SetFsyncDelay(0)
	if took := timed("fsync without delay", f.Sync); took >= delay {
		t.Errorf("fsync after SetFsyncDelay(0) took %v", took)
	}
	if st := ffs.Stats(); st.Fsyncs < 8 || st.Writes < 1 {
		t.Errorf("stats %+v: want ≥ 8 fsyncs, ≥ 1 write", st)
	}
	if _, err := ffs.Crash(); !errors.Is(err, ErrNoPowerLoss) {
		t.Errorf("Crash without PowerLoss: %v", err)
	}
}

// After Crash, Unmount and Mount again over the same backing dir is the
// reboot: the new mount shows the durable state and accepts writes.
func TestRemountAfterCrash(t *testing.T) {
	backing, mnt, ffs := mount(t, Options{PowerLoss: true})
	tcheck(t, os.MkdirAll(filepath.Join(mnt, "a", "b"), 0o755), "mkdir")
	f, err := os.Create(filepath.Join(mnt, "a", "b", "f"))
	tcheck(t, err, "create")
	writeAt(t, f, "synced", 0)
	tcheck(t, f.Sync(), "fsync")
	writeAt(t, f, "+lost", 6)
	f.Close()
	_, err = ffs.Crash()
	tcheck(t, err, "crash")
	tcheck(t, ffs.Unmount(), "unmount")

	again, err := Mount(backing, mnt, Options{PowerLoss: true})
	tcheck(t, err, "remount")
	t.Cleanup(func() { again.Unmount() })
	got, err := os.ReadFile(filepath.Join(mnt, "a", "b", "f"))
	tcheck(t, err, "read after remount")
	if string(got) != "synced" {
		t.Errorf("after remount: %q, want %q", got, "synced")
	}
	tcheck(t, os.WriteFile(filepath.Join(mnt, "a", "new"), []byte("ok"), 0o644), "write after remount")
}
