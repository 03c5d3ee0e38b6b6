//go:build linux

package main

import (
	"os"
	"syscall"
	"unsafe"
)

// echoOff turns off the echo of the terminal f and returns the function
// that puts its settings back; ok is false when f is no terminal. Lines
// are still read whole and ^C still interrupts (ICANON, ISIG), as
// golang.org/x/term's ReadPassword has it.
func echoOff(f *os.File) (restore func(), ok bool) {
	fd := f.Fd()
	var old syscall.Termios
	if ioctlTermios(fd, syscall.TCGETS, &old) != nil {
		return nil, false
	}
	t := old
	t.Lflag &^= syscall.ECHO
	t.Lflag |= syscall.ICANON | syscall.ISIG
	t.Iflag |= syscall.ICRNL
	if ioctlTermios(fd, syscall.TCSETS, &t) != nil {
		return nil, false
	}
	return func() { _ = ioctlTermios(fd, syscall.TCSETS, &old) }, true
}

func ioctlTermios(fd, req uintptr, t *syscall.Termios) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(t))); errno != 0 {
		return errno
	}
	return nil
}
