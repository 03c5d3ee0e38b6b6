package testutil

import (
	"syscall"
	"time"
)

// ProcessCPU is the process's CPU time, user and system (an embedded
// server's included): benchmarks report it per operation, since on a
// shared machine wall-clock time measures the neighbours.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
