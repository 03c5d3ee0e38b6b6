//go:build !linux

package main

import "os"

// echoOff is the Linux build's; elsewhere a terminal echoes the password,
// and passwd says so.
func echoOff(*os.File) (restore func(), ok bool) { return nil, false }
