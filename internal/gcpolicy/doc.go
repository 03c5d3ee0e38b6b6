// Package gcpolicy paces the Go garbage collector for a daemon: a target
// (GOGC) and a floor under the heap goal. serve applies it at start
// (--gc-percent, --gc-min-heap), and outflow-bench's in-process pipeline
// applies the same defaults, so its profiles show serve's collector.
//
// Why both. With a deferred backlog most of a daemon's heap is long-lived
// JetStream state (nats-server's schedules and subject index, about 350
// bytes per deferred envelope) that every cycle marks again, and a cycle
// comes each time the program allocates the target's share of the live
// heap. The marking per byte allocated is therefore the same at any size
// of backlog, and halves when the target doubles: a million deferred
// envelopes cost each fresh message 130–160 µs of marking at 50 and 50–
// 100 µs at Go's own 100, serve's default, which the memory per
// deferred envelope pays for (647 against 570 bytes, under the 1 KiB the
// backlog may cost; docs/benchmarks.md, scenario 3). Without a backlog
// the live heap is a few tens of MiB, and the same target starts a
// cycle every 10 to 20 MiB allocated: at 50 the collector took 38–41 µs
// of each relayed message's CPU, and 11–20 µs with a floor of 48 MiB
// (docs/benchmarks.md; a floor of 128 MiB took the collector's share
// lower but not the total, which a heap larger than the caches may
// explain). Go has a ceiling (GOMEMLIMIT) but no floor, so this package
// keeps one: after every cycle it reads the live heap and, while live ×
// (1 + GOGC/100) would be below the floor, raises the target for the
// next cycle so the goal is the floor. A heap above the floor is paced
// by the target alone. Unlike a ballast allocation, nothing is
// allocated, so the heap metrics stay true and no pages can become
// resident that the heap does not use.
package gcpolicy
