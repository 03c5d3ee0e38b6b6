// Package faultfs is in charge of a filesystem that misbehaves on purpose,
// for the reliability tests: a FUSE passthrough (loopback) of a backing
// directory whose fsync can be made slow, and which can simulate a power
// loss by throwing away every write that was not fsynced.
//
// Mount(backing, mountpoint, Options) serves the backing directory at the
// mountpoint from the calling process (go-fuse, through fusermount3 and
// /dev/fuse). A daemon whose data directory is the mountpoint does all its
// I/O through this process. Available reports why a mount cannot work here
// (no /dev/fuse, no fusermount3), so a test can skip saying so.
//
// # Slow fsync
//
// Options.FsyncDelay (default 0) is added to every fsync and fdatasync of
// a file and every fsync of a directory, before the real fsync of the
// backing file: each call blocks its caller that long, as on a slow or
// overloaded disk. Fsyncs of different files run in parallel, each with
// its own delay (the kernel serialises fsyncs of one file); the point is
// the latency each caller sees, not a model of a device's queue.
//
// # Power loss
//
// With Options.PowerLoss, the filesystem keeps, per file, an undo log of
// what changed since that file's last fsync, and Crash rolls every file
// back to its durable state, leaving the backing directory as a disk would
// be after the power went out. The model, exactly:
//
//   - File contents are durable only after an fsync or fdatasync of that
//     file (any descriptor of the inode). That covers write, truncate (also
//     the O_TRUNC of an open), and fallocate. Changes made before the fsync
//     call are kept by Crash once the fsync has returned; changes made while
//     it runs (during its delay) are not covered by it; Crash during an
//     fsync keeps nothing of it. A write through a descriptor opened with
//     O_SYNC or O_DSYNC is durable when it returns (the kernel follows each
//     such write with an fsync request, which is what makes it so here).
//   - Namespace operations (create, mkdir, mknod, symlink, link, rename,
//     unlink, rmdir) and attribute changes (chmod, chown, utimes, xattrs)
//     are durable as soon as they return: Crash does not undo them. A file
//     created and written but never fsynced survives Crash with the size it
//     had at its last fsync (0 if none); a file renamed over another keeps
//     the renamed inode, with only its fsynced contents.
//
// Treating namespace operations as immediately durable is simpler than a
// per-directory model and still tests what decides whether accepted mail
// survives. On the journalling filesystems a data directory sits on (ext4,
// XFS), one fsync commits the journal, and with it every earlier namespace
// change, so a directory entry lost while its file's fsynced data survived
// is not what they do. What such a store must get right is the contents:
// nats-server's file store appends each message to a block file and fsyncs
// that block (and the stream's message directory when a block appears);
// outflow's group commit (queue/storesync.go) does the same before each
// 250. This model loses every unsynced append and so fails a 250 given
// before its block's fsync. What it cannot catch is a missing fsync of a
// directory (both do fsync directories where POSIX asks for it).
//
// The mount is made without the kernel's writeback cache, so each write(2)
// reaches this process before it returns to the writer, and without FUSE
// passthrough, so no read or write bypasses the undo log. A process killed
// with SIGKILL therefore leaves nothing in the kernel that has not been
// seen here; Crash after the kill is the power cut. After Crash every call
// that would change the backing directory fails with EIO; reads still
// work. Unmount, then Mount again over the same backing directory, is the
// reboot.
//
// Memory: the undo log keeps a copy of each 4 KiB page overwritten below a
// file's durable size (appends cost nothing but the size), until the next
// fsync of that file.
package faultfs
