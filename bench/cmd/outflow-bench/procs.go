package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/outflow/outflow/internal/postfixinst"
	"github.com/outflow/outflow/internal/testutil"
)

// freePort returns a loopback address nothing listens on right now.
func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

// sink is Postfix's smtp-sink counting accepted messages. It can be stopped
// and started again on the same address (an outage); Count keeps counting
// across restarts.
type sink struct {
	addr  string
	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	base  int64 // messages counted by earlier incarnations
	cur   atomic.Int64
	total atomic.Int64
	cpu   time.Duration // CPU time of the incarnations stopped so far
}

func newSink(addr string) *sink { return &sink{addr: addr} }

// Start runs smtp-sink on s.addr and waits until it accepts connections.
func (s *sink) Start() error {
	bin, err := postfixinst.LookPath("smtp-sink")
	if err != nil {
		return err
	}
	args := []string{"-c"}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody") // smtp-sink refuses to run as root
	}
	args = append(args, s.addr, "1024")
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("smtp-sink: %w", err)
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, make(chan struct{})
	s.cur.Store(0)
	done := s.done
	s.mu.Unlock()
	go func() {
		defer close(done)
		r := bufio.NewReaderSize(out, 64<<10)
		for {
			// smtp-sink -c rewrites one status line, "sess=N quit=N mesg=N",
			// separated by carriage returns.
			tok, err := r.ReadSlice('\r')
			if i := bytes.LastIndex(tok, []byte("mesg=")); i >= 0 {
				v := tok[i+5:]
				v = bytes.TrimRight(v, "\r\n ")
				if n, perr := strconv.ParseInt(string(v), 10, 64); perr == nil {
					s.cur.Store(n)
					s.total.Store(s.base + n)
				}
			}
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
				_ = cmd.Wait()
				return
			}
		}
	}()
	return waitListening(s.addr, 10*time.Second)
}

// Stop kills smtp-sink; the port is closed (connections refused) until the
// next Start.
func (s *sink) Stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
	s.cpu += cpuOf(cmd.ProcessState)
	s.base += s.cur.Load()
	s.cur.Store(0)
	s.total.Store(s.base)
}

// CPU is the CPU time of the incarnations stopped so far.
func (s *sink) CPU() time.Duration { return s.cpu }

// Count is how many messages every incarnation of the sink accepted.
func (s *sink) Count() int64 { return s.total.Load() }

// WaitCount waits until Count reaches n; it returns the time it did.
func (s *sink) WaitCount(n int64, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		if s.Count() >= n {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("sink: %d of %d messages after %v", s.Count(), n, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func waitListening(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening after %v: %w", addr, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// smtpSource runs Postfix's smtp-source: sessions parallel sessions, msgs
// messages of size bytes, all to one recipient at example.com. It returns
// the CPU time smtp-source used.
func smtpSource(ctx context.Context, addr string, sessions, msgs, size int) (time.Duration, error) {
	return smtpSourceTo(ctx, addr, "rcpt@example.com", sessions, msgs, size)
}

func smtpSourceArgs(addr, rcpt string, sessions, msgs, size int) []string {
	return []string{"-s", strconv.Itoa(sessions), "-m", strconv.Itoa(msgs), "-l", strconv.Itoa(size),
		"-f", "bench@source.test", "-t", rcpt, addr}
}

// smtpSourceTo is smtpSource with another recipient.
func smtpSourceTo(ctx context.Context, addr, rcpt string, sessions, msgs, size int) (time.Duration, error) {
	bin, err := postfixinst.LookPath("smtp-source")
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, bin, smtpSourceArgs(addr, rcpt, sessions, msgs, size)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("smtp-source: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return cpuOf(cmd.ProcessState), nil
}

// cpuOf is the user and system CPU time of an exited process.
func cpuOf(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// machineBusy is the CPU time all cores of the machine have spent doing
// anything but idling or waiting for I/O since boot (/proc/stat).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	return statBusy(b)
}

// statBusy reads the busy time off /proc/stat's first line, "cpu user nice
// system idle iowait irq softirq steal guest guest_nice", in clock ticks:
// all but idle and iowait; guest time is already inside user.
func statBusy(stat []byte) time.Duration {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		if i != 3 && i != 4 && i < 8 {
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// selfCPU is the CPU time this harness has used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rssKiB reads VmRSS of pid from /proc.
func rssKiB(pid int) int64 { return procKiB("/proc/"+strconv.Itoa(pid)+"/status", "VmRSS:") }

// pssKiB reads the proportional set size of pid from /proc.
func pssKiB(pid int) int64 { return procKiB("/proc/"+strconv.Itoa(pid)+"/smaps_rollup", "Pss:") }

// procKiB reads the "<key> <n> kB" line of a /proc file.
func procKiB(file, key string) int64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// procCPU is the user and system CPU time process pid has used so far
// (/proc/PID/stat), or 0 if it cannot be read.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	return pidStatCPU(b)
}

// pidStatCPU reads utime and stime, fields 14 and 15 of /proc/PID/stat, in
// clock ticks. Field 2, the command name, is in parentheses and may hold
// spaces and parentheses itself, so fields are counted from the last ')'.
func pidStatCPU(stat []byte) time.Duration {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(stat[i+1:])) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / clockTicks
}

// outflowProc is a running `outflow serve`.
type outflowProc struct {
	cmd      *exec.Cmd
	SMTPAddr string
	HTTPAddr string
	Data     string
	done     chan struct{}
	log      testutil.SyncBuffer // the daemon's stderr
}

// startOutflow starts bin serve on data, relaying to relay, and waits for
// /readyz.
func startOutflow(bin, data, relay string, extra ...string) (*outflowProc, error) {
	return startOutflowLogged(bin, data, relay, nil, extra...)
}

// startOutflowLogged is startOutflow that also copies the daemon's stderr
// (its log) to logTo, when not nil.
func startOutflowLogged(bin, data, relay string, logTo io.Writer, extra ...string) (*outflowProc, error) {
	p := &outflowProc{SMTPAddr: freePort(), HTTPAddr: freePort(), Data: data, done: make(chan struct{})}
	args := append([]string{"serve", "--data", data, "--smtp-addr", p.SMTPAddr, "--http-addr", p.HTTPAddr,
		"--nats-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0", "--relay", relay, "--relay-tls", "none",
		"--trusted-networks", "127.0.0.0/8", "--log-level", "warn"}, extra...)
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout = io.Discard
	p.cmd.Stderr = &p.log
	if logTo != nil {
		p.cmd.Stderr = io.MultiWriter(&p.log, logTo)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("outflow exited before ready: %s", p.Logs())
		default:
		}
		resp, err := http.Get("http://" + p.HTTPAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			p.Kill()
			return nil, fmt.Errorf("outflow not ready after 90s: %s", p.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p, waitListening(p.SMTPAddr, 10*time.Second)
}

// Logs is the end of the daemon's stderr so far.
func (p *outflowProc) Logs() string {
	s := p.log.String()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}

func (p *outflowProc) Pid() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM and waits up to a minute. With BENCH_LOGS set to a
// directory, the daemon's stderr (warnings and every decision line) is
// kept there, one file per data directory, for a look at a run's outliers.
func (p *outflowProc) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.Kill()
	}
	if dir := os.Getenv("BENCH_LOGS"); dir != "" {
		name := filepath.Join(dir, filepath.Base(p.Data)+".log")
		if err := os.WriteFile(name, []byte(p.log.String()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "outflow-bench: keep the daemon's log:", err)
		}
	}
}

func (p *outflowProc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// postfixInst is a private Postfix instance (internal/postfixinst)
// relaying everything to the sink.
type postfixInst struct{ *postfixinst.Instance }

func startPostfix(relay string, extra map[string]string) (*postfixInst, error) {
	dir, err := os.MkdirTemp("", "outflow-bench-postfix-")
	if err != nil {
		return nil, err
	}
	main := map[string]string{"relayhost": postfixinst.RelayHost(relay)}
	for k, v := range extra {
		main[k] = v
	}
	inst, err := postfixinst.Prepare(dir, freePort(), main)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	p := &postfixInst{inst}
	if out, err := p.postfix("start"); err != nil {
		p.cleanup()
		return nil, fmt.Errorf("postfix start: %w: %s", err, out)
	}
	if err := waitListening(p.Addr, 30*time.Second); err != nil {
		p.Stop()
		return nil, err
	}
	return p, nil
}

func (p *postfixInst) postfix(verb string) (string, error) {
	cmd, err := p.Command(verb)
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// QueueCount counts files in the instance's queue directories.
func (p *postfixInst) QueueCount() int {
	return p.countFiles("incoming", "active", "deferred", "maildrop")
}

// DeferredCount counts files in the instance's deferred queue.
func (p *postfixInst) DeferredCount() int { return p.countFiles("deferred") }

// countFiles counts the files under the named queue directories.
func (p *postfixInst) countFiles(queues ...string) int {
	n := 0
	for _, q := range queues {
		_ = filepath.Walk(filepath.Join(p.Queue(), q), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				n++
			}
			return nil
		})
	}
	return n
}

// PSSKiB sums the proportional set size (Pss of smaps_rollup: each shared
// page split among the processes that map it) over the instance's master
// and its children (smtpd, cleanup, qmgr, smtp, ...). Postfix's memory is
// spread over processes that share most of their pages, so a sum of VmRSS
// would count the libraries once per process.
func (p *postfixInst) PSSKiB() int64 {
	var total int64
	for _, pid := range p.Pids() {
		total += pssKiB(pid)
	}
	return total
}

// Pids are the instance's master and its children (smtpd, cleanup, qmgr,
// smtp, ...), master first; none if its pid file cannot be read.
func (p *postfixInst) Pids() []int {
	b, err := os.ReadFile(filepath.Join(p.Queue(), "pid", "master.pid"))
	if err != nil {
		return nil
	}
	master, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	pids := []int{master}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after
		// its closing parenthesis.
		rest := string(st[bytes.LastIndexByte(st, ')')+1:])
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(master) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Stop stops the instance's master and removes its directories.
func (p *postfixInst) Stop() {
	_, _ = p.postfix("stop")
	pidFile := filepath.Join(p.Queue(), "pid", "master.pid")
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			break
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if pid <= 0 || syscall.Kill(pid, 0) != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if b, err := os.ReadFile(pidFile); err == nil {
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 && syscall.Kill(pid, 0) == nil {
			_, _ = p.postfix("abort")
			time.Sleep(time.Second)
		}
	}
	p.cleanup()
}

func (p *postfixInst) cleanup() { _ = os.RemoveAll(p.Dir) }

// metricsMatching returns the /metrics lines (no comments) that contain
// any of parts, for debugging a run.
func (p *outflowProc) metricsMatching(parts ...string) string {
	resp, err := http.Get("http://" + p.HTTPAddr + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, part := range parts {
			if strings.Contains(line, part) {
				b.WriteString(line + "\n")
				break
			}
		}
	}
	return b.String()
}
