package faultfs

import (
	"fmt"
	"sync"
	"syscall"
)

// pageSize is the unit in which overwritten contents are saved (bytes).
const pageSize = 4096

// undoLog is what Crash needs to roll one file back to its durable
// contents: a stack of generations, oldest first. A generation starts with
// the first change after an fsync began (or after the file was first
// seen) and records the file's size at that moment and the original bytes
// of every page below that size changed since. An fsync seals the newest
// generation when it starts and, once the real fsync returned, drops every
// generation it sealed: changes made during the fsync land in a new
// generation and stay undoable.
type undoLog struct {
	fd     int // a descriptor of the backing inode, owned by the log
	gens   []*generation
	sealed uint64 // id of the newest generation an fsync has sealed
}

type generation struct {
	id    uint64
	size  int64            // the file's size when the generation began
	pages map[int64][]byte // page index -> its bytes (clipped to size) at the start
}

// undoTable is the undo logs of one mount, by inode.
type undoTable struct {
	mu     sync.Mutex
	logs   map[uint64]*undoLog // by StableAttr.Ino
	nextID uint64
	saved  int64 // bytes of page copies held, for tests and figures
}

func newUndoTable() *undoTable {
	return &undoTable{logs: map[uint64]*undoLog{}}
}

// change records, before the caller changes the bytes [off, end) of the
// inode ino (and possibly its size), what is needed to undo it. fd is a
// descriptor of the backing file the caller holds, open for anything.
// The caller makes the change while holding the returned unlock, so
// concurrent changes of one file are recorded in order.
func (u *undoTable) change(ino uint64, fd int, off, end int64) (unlock func(), err error) {
	u.mu.Lock()
	defer func() {
		if err != nil {
			u.mu.Unlock()
		}
	}()
	l := u.logs[ino]
	if l == nil {
		// A descriptor of its own that can read and write, whatever the
		// caller's was opened for; reopened through /proc so it is the
		// same inode even if the file was renamed or unlinked.
		own, err := syscall.Open(fmt.Sprintf("/proc/self/fd/%d", fd), syscall.O_RDWR|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("reopen backing file: %w", err)
		}
		l = &undoLog{fd: own}
		u.logs[ino] = l
	}
	g := l.current()
	if g == nil {
		var st syscall.Stat_t
		if err := syscall.Fstat(l.fd, &st); err != nil {
			return nil, fmt.Errorf("fstat backing file: %w", err)
		}
		u.nextID++
		g = &generation{id: u.nextID, size: st.Size, pages: map[int64][]byte{}}
		l.gens = append(l.gens, g)
	}
	end = min(end, g.size)
	for p := off / pageSize; p*pageSize < end; p++ {
		if _, ok := g.pages[p]; ok {
			continue
		}
		start := p * pageSize
		buf := make([]byte, min(pageSize, g.size-start))
		m, err := syscall.Pread(l.fd, buf, start)
		if err != nil {
			return nil, fmt.Errorf("save page %d: %w", p, err)
		}
		g.pages[p] = buf[:m]
		u.saved += int64(m)
	}
	return u.mu.Unlock, nil
}

// current is the generation new changes go to, nil when a new one must
// start (none yet, or the newest is sealed by an fsync).
func (l *undoLog) current() *generation {
	if n := len(l.gens); n > 0 && l.gens[n-1].id > l.sealed {
		return l.gens[n-1]
	}
	return nil
}

// seal starts an fsync of ino: every change so far will be durable when
// commit(ino, seal) is called after the real fsync returned.
func (u *undoTable) seal(ino uint64) uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.logs[ino]
	if l == nil || len(l.gens) == 0 {
		return 0
	}
	l.sealed = l.gens[len(l.gens)-1].id
	return l.sealed
}

// commit drops the generations an fsync sealed: they are on disk now.
func (u *undoTable) commit(ino, seal uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.logs[ino]
	if l == nil || seal == 0 {
		return
	}
	keep := l.gens[:0]
	for _, g := range l.gens {
		if g.id > seal {
			keep = append(keep, g)
			continue
		}
		for _, p := range g.pages {
			u.saved -= int64(len(p))
		}
	}
	clear(l.gens[len(keep):])
	l.gens = keep
	if len(l.gens) == 0 {
		syscall.Close(l.fd)
		delete(u.logs, ino)
	}
}

// rollback restores every logged file to its durable contents, newest
// generation first, and forgets the logs. It returns how many files it
// changed and the first error (it carries on past errors).
func (u *undoTable) rollback() (files int, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	note := func(e error) {
		if err == nil {
			err = e
		}
	}
	for ino, l := range u.logs {
		for i := len(l.gens) - 1; i >= 0; i-- {
			g := l.gens[i]
			for p, b := range g.pages {
				if _, e := syscall.Pwrite(l.fd, b, p*pageSize); e != nil {
					note(fmt.Errorf("restore page %d of inode %d: %w", p, ino, e))
				}
			}
			if e := syscall.Ftruncate(l.fd, g.size); e != nil {
				note(fmt.Errorf("truncate inode %d to %d: %w", ino, g.size, e))
			}
		}
		if len(l.gens) > 0 {
			files++
		}
		syscall.Close(l.fd)
		delete(u.logs, ino)
	}
	u.saved = 0
	return files, err
}

// pending is how many files have changes not yet fsynced, and how many
// bytes of saved pages the logs hold.
func (u *undoTable) pending() (files int, savedBytes int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, l := range u.logs {
		if len(l.gens) > 0 {
			files++
		}
	}
	return files, u.saved
}
