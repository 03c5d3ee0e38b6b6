package testutil

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// EachSource calls fn with the path (relative to root) and text of every
// Go file under root that is not a test, leaving out the directories
// named in skip and hidden ones: for the tests that read the code itself
// (every metric documented, every log key of one type).
func EachSource(t testing.TB, root string, skip []string, fn func(path, src string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			for _, s := range skip {
				if n == s {
					return filepath.SkipDir
				}
			}
			if strings.HasPrefix(n, ".") && p != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fn(rel, string(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
