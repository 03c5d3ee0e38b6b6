package testutil

import (
	"os"
	"strings"
	"testing"
)

// DocSection is the part of the file at path (a doc under docs/, from the
// test's package directory) that follows start, up to the first end after
// it (or the end of the file). The test fails when the file cannot be read
// or start is not in it: a doc test whose section moved must not pass by
// checking nothing.
func DocSection(t *testing.T, path, start, end string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), start)
	if !ok {
		t.Fatalf("%s has no %q", path, start)
	}
	sec, _, _ = strings.Cut(sec, end)
	return sec
}
