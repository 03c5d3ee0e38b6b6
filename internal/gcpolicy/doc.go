// Package gcpolicy paces the Go garbage collector for a daemon: a target
// (GOGC) and a floor under the heap goal. serve applies it at start
// (--gc-percent, --gc-min-heap), and outflow-bench's in-process pipeline
// applies the same defaults, so its profiles show serve's collector.
//
// Why both. With a deferred backlog most of a daemon's heap is long-lived
// JetStream state that every cycle marks again, so a target below Go's
// 100 saves memory there (serve's default 50; docs/benchmarks.md,
// scenario 3). Without a backlog the live heap is a few tens of MiB, and
// the same target starts a cycle every 10 MiB or so allocated: at 50 the
// collector took 38–41 µs of each relayed message's CPU, and 11–20 µs
// with a floor of 48 MiB (docs/benchmarks.md; a floor of 128 MiB took
// the collector's share lower but not the total, which a heap larger than
// the caches may explain). Go has a
// ceiling (GOMEMLIMIT) but no floor, so this package keeps one: after
// every cycle it reads the live heap and, while live × (1 + GOGC/100)
// would be below the floor, raises the target for the next cycle so the
// goal is the floor. A heap above the floor is paced by the target alone.
// Unlike a ballast allocation, nothing is allocated, so the heap metrics
// stay true and no pages can become resident that the heap does not use.
package gcpolicy
