package faultfs

import (
	"context"
	"math"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// node is a loopback node whose changes go through the fault controls.
// Everything not overridden here is the loopback's own (lookups, reads,
// directory listings, attributes).
type node struct {
	*fs.LoopbackNode
	fs *FS
}

var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeWriter         = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeAllocater      = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeSetxattrer     = (*node)(nil)
	_ fs.NodeRemovexattrer  = (*node)(nil)
	_ fs.FileReader         = (*handle)(nil)
	_ fs.FileReleaser       = (*handle)(nil)
	_ fs.FileFlusher        = (*handle)(nil)
	_ fs.FileGetattrer      = (*handle)(nil)
	_ fs.FileStatxer        = (*handle)(nil)
	_ fs.FileLseeker        = (*handle)(nil)
	_ fs.FileReaddirenter   = (*dirHandle)(nil)
	_ fs.FileReleasedirer   = (*dirHandle)(nil)
	_ fs.FileSeekdirer      = (*dirHandle)(nil)
)

// WrapChild makes every node of the tree a faultfs node.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if ln, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: ln, fs: n.fs}
	}
	return ops
}

func (n *node) ino() uint64 { return n.StableAttr().Ino }

func (n *node) isDir() bool { return n.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR }

// backingPath is the node's path in the backing directory.
func (n *node) backingPath() string {
	return filepath.Join(n.RootData.Path, n.Path(nil))
}

// handle is an open file. It deliberately does not offer the loopback's
// passthrough descriptor, writes or fsync: those go through the node.
type handle struct {
	lf *fs.LoopbackFile
	fd int // lf's descriptor, owned by lf
}

func newHandle(fh fs.FileHandle) (*handle, syscall.Errno) {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		return nil, syscall.EIO
	}
	fd, ok := lf.PassthroughFd()
	if !ok {
		return nil, syscall.EBADF
	}
	return &handle{lf: lf, fd: fd}, 0
}

func (h *handle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.lf.Read(ctx, buf, off)
}
func (h *handle) Release(ctx context.Context) syscall.Errno { return h.lf.Release(ctx) }
func (h *handle) Flush(ctx context.Context) syscall.Errno   { return h.lf.Flush(ctx) }
func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}
func (h *handle) Statx(ctx context.Context, flags, mask uint32, out *fuse.StatxOut) syscall.Errno {
	return h.lf.Statx(ctx, flags, mask, out)
}
func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}

// dirHandle is an open directory. It leaves out the loopback's Fsyncdir,
// so a directory's fsync reaches node.Fsync and its delay.
type dirHandle struct{ ds fs.FileHandle }

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.ds.(fs.FileReaddirenter).Readdirent(ctx)
}
func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.ds.(fs.FileReleasedirer).Releasedir(ctx, flags)
}
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.ds.(fs.FileSeekdirer).Seekdir(ctx, off)
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ds, ff, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return &dirHandle{ds: ds}, ff, 0
}

// writable reports whether open flags allow changing the file.
func writable(flags uint32) bool {
	return flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if writable(flags) {
		if n.fs.enter() {
			return nil, 0, syscall.EIO
		}
		defer n.fs.leave()
	}
	// O_TRUNC is done here, through the undo log, not by open(2).
	trunc := flags&syscall.O_TRUNC != 0
	fh, ff, errno := n.LoopbackNode.Open(ctx, flags&^syscall.O_TRUNC)
	if errno != 0 {
		return nil, 0, errno
	}
	h, errno := newHandle(fh)
	if errno != 0 {
		return nil, 0, errno
	}
	if trunc {
		if errno := n.fs.truncate(n.ino(), h.fd, 0); errno != 0 {
			h.lf.Release(ctx)
			return nil, 0, errno
		}
	}
	return h, ff, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if n.fs.enter() {
		return nil, nil, 0, syscall.EIO
	}
	defer n.fs.leave()
	trunc := flags&syscall.O_TRUNC != 0
	ch, fh, ff, errno := n.LoopbackNode.Create(ctx, name, flags&^syscall.O_TRUNC, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	h, errno := newHandle(fh)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if trunc && out.Size > 0 {
		if errno := n.fs.truncate(ch.StableAttr().Ino, h.fd, 0); errno != 0 {
			h.lf.Release(ctx)
			return nil, nil, 0, errno
		}
		out.Size = 0
	}
	return ch, h, ff, 0
}

// truncate sets a file's size through the undo log. The caller is inside
// enter/leave.
func (f *FS) truncate(ino uint64, fd int, size int64) syscall.Errno {
	if f.powerLoss {
		unlock, err := f.undo.change(ino, fd, size, math.MaxInt64)
		if err != nil {
			return fs.ToErrno(err)
		}
		defer unlock()
	}
	return fs.ToErrno(syscall.Ftruncate(fd, size))
}

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	h, ok := f.(*handle)
	if !ok {
		return 0, syscall.EBADF
	}
	if n.fs.enter() {
		return 0, syscall.EIO
	}
	defer n.fs.leave()
	n.fs.writes.Add(1)
	if n.fs.powerLoss {
		unlock, err := n.fs.undo.change(n.ino(), h.fd, off, off+int64(len(data)))
		if err != nil {
			return 0, fs.ToErrno(err)
		}
		defer unlock()
	}
	w, err := syscall.Pwrite(h.fd, data, off)
	return uint32(max(w, 0)), fs.ToErrno(err)
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	var inner fs.FileHandle // a nil interface unless f is one of ours
	h, _ := f.(*handle)
	if h != nil {
		inner = h.lf
	}
	if size, ok := in.GetSize(); ok && n.fs.powerLoss {
		fd := -1
		if h != nil {
			fd = h.fd
		} else {
			var err error
			if fd, err = syscall.Open(n.backingPath(), syscall.O_RDONLY|syscall.O_CLOEXEC, 0); err != nil {
				return fs.ToErrno(err)
			}
			defer syscall.Close(fd)
		}
		unlock, err := n.fs.undo.change(n.ino(), fd, int64(size), math.MaxInt64)
		if err != nil {
			return fs.ToErrno(err)
		}
		defer unlock()
	}
	return n.LoopbackNode.Setattr(ctx, inner, in, out)
}

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	h, ok := f.(*handle)
	if !ok {
		return syscall.EBADF
	}
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	if n.fs.powerLoss {
		// Punching a hole or zeroing a range changes contents; a plain
		// allocation may change the size. Both are undone alike.
		unlock, err := n.fs.undo.change(n.ino(), h.fd, int64(off), int64(off+size))
		if err != nil {
			return fs.ToErrno(err)
		}
		defer unlock()
	}
	return h.lf.Allocate(ctx, off, size, mode)
}

// Fsync serves fsync and fdatasync of files and directories: the delay,
// then the real fsync, then (power-loss mode) what it covers becomes
// durable.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	n.fs.fsyncs.Add(1)
	var seal uint64
	if !n.isDir() {
		seal = n.fs.undo.seal(n.ino())
	}
	n.fs.delay()
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	var err error
	if h, ok := f.(*handle); ok {
		err = syscall.Fsync(h.fd)
	} else {
		var fd int
		if fd, err = syscall.Open(n.backingPath(), syscall.O_RDONLY|syscall.O_CLOEXEC, 0); err == nil {
			err = syscall.Fsync(fd)
			syscall.Close(fd)
		}
	}
	if err != nil {
		return fs.ToErrno(err)
	}
	n.fs.undo.commit(n.ino(), seal)
	return 0
}

// CopyFileRange is refused so the kernel copies with reads and writes,
// which the undo log sees.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle,
	offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOTSUP
}

// Tmpfile (O_TMPFILE) is not offered.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.ENOTSUP
}

// Namespace and attribute changes: durable at once (see the package doc),
// refused after Crash.

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fs.enter() {
		return nil, syscall.EIO
	}
	defer n.fs.leave()
	return n.LoopbackNode.Mkdir(ctx, name, mode, out)
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fs.enter() {
		return nil, syscall.EIO
	}
	defer n.fs.leave()
	return n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	return n.LoopbackNode.Unlink(ctx, name)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	return n.LoopbackNode.Rmdir(ctx, name)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	// The loopback's rename wants its own node type as the new parent.
	if np, ok := newParent.(*node); ok {
		newParent = np.LoopbackNode
	}
	return n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fs.enter() {
		return nil, syscall.EIO
	}
	defer n.fs.leave()
	return n.LoopbackNode.Symlink(ctx, target, name, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if n.fs.enter() {
		return nil, syscall.EIO
	}
	defer n.fs.leave()
	if t, ok := target.(*node); ok {
		target = t.LoopbackNode
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	return n.LoopbackNode.Setxattr(ctx, attr, data, flags)
}

func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.fs.enter() {
		return syscall.EIO
	}
	defer n.fs.leave()
	return n.LoopbackNode.Removexattr(ctx, attr)
}
