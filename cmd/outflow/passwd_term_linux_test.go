//go:build linux

package main

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"
)

// openPTY opens a pseudo-terminal: the master end, and the terminal end a
// program reads as its stdin.
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Skipf("unlockpt: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, master.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Skipf("ptsname: %v", errno)
	}
	tty, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open the terminal end: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return master, tty
}

// promptWriter closes shown at its first write: the prompt, which passwd
// writes once the echo is off.
type promptWriter struct {
	shown chan struct{}
	done  bool
}

func (w *promptWriter) Write(p []byte) (int, error) {
	if !w.done {
		w.done = true
		close(w.shown)
	}
	return len(p), nil
}

// TestPasswdReadsWithoutEcho: a password typed at a terminal is read
// without being echoed to it, and the terminal's echo is back afterwards.
func TestPasswdReadsWithoutEcho(t *testing.T) {
	master, tty := openPTY(t)
	var st syscall.Termios
	if err := ioctlTermios(tty.Fd(), syscall.TCGETS, &st); err != nil || st.Lflag&syscall.ECHO == 0 {
		t.Fatalf("a new terminal without echo (%v)", err)
	}
	type result struct {
		pw  string
		err error
	}
	done := make(chan result, 1)
	prompt := &promptWriter{shown: make(chan struct{})}
	go func() {
		pw, err := readPassword(tty, prompt)
		done <- result{pw, err}
	}()
	<-prompt.shown
	if _, err := master.WriteString("s3cret-typed\n"); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.pw != "s3cret-typed" {
		t.Fatalf("read %q, %v", r.pw, r.err)
	}
	// What the terminal showed: everything the master reads before a
	// marker written after the read.
	if _, err := tty.WriteString("END-OF-TEST\n"); err != nil {
		t.Fatal(err)
	}
	var shown strings.Builder
	br := bufio.NewReader(master)
	for !strings.Contains(shown.String(), "END-OF-TEST") {
		line, err := br.ReadString('\n')
		shown.WriteString(line)
		if err != nil {
			t.Fatalf("reading the terminal: %v (so far %q)", err, shown.String())
		}
	}
	if strings.Contains(shown.String(), "s3cret") {
		t.Errorf("the password was echoed: %q", shown.String())
	}
	if err := ioctlTermios(tty.Fd(), syscall.TCGETS, &st); err != nil {
		t.Fatal(err)
	}
	if st.Lflag&syscall.ECHO == 0 {
		t.Error("the terminal's echo was not put back")
	}
}

// TestPasswdPipedInput: piped in (no terminal), the first line is the
// password and no prompt is written.
func TestPasswdPipedInput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := w.WriteString("piped-pw\nsecond line\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	prompt := &promptWriter{shown: make(chan struct{})}
	pw, err := readPassword(r, prompt)
	if err != nil || pw != "piped-pw" || prompt.done {
		t.Errorf("read %q, %v, prompted %v", pw, err, prompt.done)
	}
}
