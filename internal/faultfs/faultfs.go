package faultfs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Options are a mount's faults. The zero value is a plain passthrough.
type Options struct {
	// FsyncDelay is added to every fsync and fdatasync (files and
	// directories) before the real one. 0: none. Settable later with
	// SetFsyncDelay.
	FsyncDelay time.Duration
	// PowerLoss keeps an undo log of every change not yet fsynced, so
	// that Crash can discard them (see the package doc for the model).
	PowerLoss bool
}

// FS is a mounted fault-injecting filesystem.
type FS struct {
	backing, mountpoint string
	server              *fuse.Server
	powerLoss           bool
	undo                *undoTable

	fsyncDelay atomic.Int64 // nanoseconds

	// gate orders Crash against changes: every change holds it shared
	// while it runs; Crash takes it exclusively, so it never rolls back
	// under a write that is half done.
	gate    sync.RWMutex
	crashed bool // guarded by gate

	fsyncs  atomic.Int64 // fsync calls served (files and directories)
	writes  atomic.Int64 // write calls served
	unmount sync.Once
	unmErr  error
}

// Available returns nil when a FUSE mount can work on this machine, or
// what is missing.
func Available() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("no /dev/fuse: %w", err)
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		if _, err2 := exec.LookPath("fusermount"); err2 != nil {
			return fmt.Errorf("neither fusermount3 nor fusermount on PATH (Debian package fuse3): %w", err)
		}
	}
	return nil
}

// Mount serves backing at mountpoint (both existing directories) until
// Unmount. The caller must Unmount, also on failure paths, or the mount
// stays behind.
func Mount(backing, mountpoint string, opts Options) (*FS, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	f := &FS{backing: backing, mountpoint: mountpoint, powerLoss: opts.PowerLoss, undo: newUndoTable()}
	f.fsyncDelay.Store(int64(opts.FsyncDelay))
	var st syscall.Stat_t
	if err := syscall.Stat(backing, &st); err != nil {
		return nil, fmt.Errorf("faultfs: backing dir: %w", err)
	}
	data := &fs.LoopbackRoot{Path: backing, Dev: uint64(st.Dev)}
	root := &node{LoopbackNode: &fs.LoopbackNode{RootData: data}, fs: f}
	data.RootNode = root // paths are computed from the wrapping root
	// The kernel may cache names and attributes for a second: every
	// change goes through this mount, which keeps those caches right, and
	// a store's recovery does many lookups. Only Crash changes the backing
	// dir behind the kernel's back, and nothing may use the mount after it.
	cache := time.Second
	srv, err := fs.Mount(mountpoint, root, &fs.Options{
		EntryTimeout:    &cache,
		AttrTimeout:     &cache,
		NegativeTimeout: &cache,
		MountOptions: fuse.MountOptions{
			FsName: "faultfs",
			Name:   "faultfs",
			// Every read and write comes through this process (see the
			// package doc): no passthrough to the backing file.
			DisabledCapabilities: fuse.CAP_PASSTHROUGH | fuse.CAP_WRITEBACK_CACHE,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("faultfs: mount %s: %w", mountpoint, err)
	}
	f.server = srv
	return f, nil
}

// Mountpoint is where the filesystem is mounted.
func (f *FS) Mountpoint() string { return f.mountpoint }

// SetFsyncDelay changes the delay added to each fsync from now on.
func (f *FS) SetFsyncDelay(d time.Duration) { f.fsyncDelay.Store(int64(d)) }

// Stats are counters of what the filesystem served.
type Stats struct {
	Fsyncs, Writes int64
	// UnsyncedFiles is how many files have changes Crash would discard;
	// UndoBytes the page copies held for them.
	UnsyncedFiles int
	UndoBytes     int64
}

// Stats returns the counters so far.
func (f *FS) Stats() Stats {
	files, b := f.undo.pending()
	return Stats{Fsyncs: f.fsyncs.Load(), Writes: f.writes.Load(), UnsyncedFiles: files, UndoBytes: b}
}

// ErrNoPowerLoss is returned by Crash on a mount without Options.PowerLoss.
var ErrNoPowerLoss = errors.New("faultfs: mounted without PowerLoss")

// Crash simulates a power loss: it waits for changes in progress, rolls
// every file back to what was fsynced, and from then on fails every
// change with EIO. It returns how many files it rolled back. Kill the
// processes using the mount first (a write after Crash fails, but one
// racing Crash may land either side of it). Then Unmount.
func (f *FS) Crash() (files int, err error) {
	if !f.powerLoss {
		return 0, ErrNoPowerLoss
	}
	f.gate.Lock()
	defer f.gate.Unlock()
	f.crashed = true
	return f.undo.rollback()
}

// Unmount unmounts the filesystem (once; later calls return the first
// result). If the kernel still holds the mount busy it falls back to a
// lazy unmount, so no mount is left behind.
func (f *FS) Unmount() error {
	f.unmount.Do(func() {
		err := f.server.Unmount()
		if err != nil {
			if out, lerr := exec.Command(fusermountBinary(), "-u", "-z", f.mountpoint).CombinedOutput(); lerr != nil {
				err = fmt.Errorf("faultfs: unmount %s: %v; lazy unmount: %v %s", f.mountpoint, err, lerr, out)
			} else {
				err = nil
			}
		}
		f.unmErr = err
	})
	return f.unmErr
}

func fusermountBinary() string {
	if p, err := exec.LookPath("fusermount3"); err == nil {
		return p
	}
	return "fusermount"
}

// enter is called by every change: it fails with crashed=true after Crash,
// otherwise the caller changes the backing dir and then calls leave.
func (f *FS) enter() (crashed bool) {
	f.gate.RLock()
	if f.crashed {
		f.gate.RUnlock()
		return true
	}
	return false
}

func (f *FS) leave() { f.gate.RUnlock() }

// delay blocks for the configured fsync delay.
func (f *FS) delay() {
	if d := time.Duration(f.fsyncDelay.Load()); d > 0 {
		time.Sleep(d) // the fault itself: a slow disk
	}
}
