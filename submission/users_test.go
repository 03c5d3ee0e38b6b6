package submission

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

func TestParseUsers(t *testing.T) {
	h, err := HashPassword("pw-one", bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	good := "# accounts\n\n  \napp:" + h + "\r\n  # indented comment\nother.team@corp:" + h + "\n"
	u, err := ParseUsers(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	if u.Len() != 2 || !u.Has("app") || !u.Has("other.team@corp") {
		t.Fatalf("users: %d", u.Len())
	}
	if !u.Verify("app", "pw-one") || u.Verify("app", "pw-two") || u.Verify("nobody", "pw-one") {
		t.Error("Verify")
	}
	if u.Verify("app", "pw-one"+strings.Repeat("x", 80)) {
		t.Error("a password over 72 bytes must never match")
	}

	for _, tc := range []struct {
		name, file, want string
	}{
		{"no colon", "# c\napp " + h + "\n", "line 2: expected name:bcrypt-hash"},
		{"bad hash", "app:" + h + "\nbad:plaintext\n", "line 2: user \"bad\": not a bcrypt hash"},
		{"empty name", "\n\n:" + h + "\n", "line 3: empty user name"},
		{"space in name", "a b:" + h + "\n", "line 1: user name contains ' '"},
		{"duplicate", "app:" + h + "\napp:" + h + "\n", "line 2: user \"app\" listed twice"},
		{"the trusted networks' tenant", "trusted:" + h + "\n", "line 1: user name \"trusted\" is reserved"},
		{"the forwarded reports' tenant", "postmaster:" + h + "\n", "line 1: user name \"postmaster\" is reserved"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseUsers(strings.NewReader(tc.file))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestLoadUsersNamesFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(p, []byte("broken\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadUsers(p)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("got %v", err)
	}
	if _, err := LoadUsers(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("missing file loaded")
	}
}

func TestHashPassword(t *testing.T) {
	if _, err := HashPassword("", 0); err == nil {
		t.Error("empty password hashed")
	}
	if _, err := HashPassword(strings.Repeat("p", 73), 0); err == nil {
		t.Error("73-byte password hashed")
	}
	if _, err := HashPassword("pw", 99); err == nil {
		t.Error("cost 99 accepted")
	}
}

func TestEnsureUsersFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path, created, user, pw, err := EnsureUsersFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !created || user != DefaultUser || len(pw) < 20 || path != filepath.Join(dir, UsersFileName) {
		t.Fatalf("created=%v user=%q len(pw)=%d path=%q", created, user, len(pw), path)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := st.Mode().Perm(); mode != 0o600 {
		t.Errorf("mode %o, want 600", mode)
	}
	u, err := LoadUsers(path)
	if err != nil {
		t.Fatal(err)
	}
	if !u.Verify(user, pw) {
		t.Error("generated password does not verify")
	}
	raw, _ := os.ReadFile(path)
	if strings.Contains(string(raw), pw) {
		t.Error("users file contains the clear password")
	}

	// Second start: the file is kept, nothing is generated.
	path2, created2, user2, pw2, err := EnsureUsersFile(dir)
	if err != nil || created2 || path2 != path || user2 != "" || pw2 != "" {
		t.Fatalf("second call: %q %v %q %q %v", path2, created2, user2, pw2, err)
	}
	raw2, _ := os.ReadFile(path)
	if string(raw2) != string(raw) {
		t.Error("users file rewritten")
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".users-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestEnsureUsersFileConcurrent(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	var mu sync.Mutex
	createdN := 0
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, created, _, _, err := EnsureUsersFile(dir)
			if err != nil {
				t.Error(err)
			}
			if created {
				mu.Lock()
				createdN++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if createdN != 1 {
		t.Fatalf("%d starts created the file, want exactly 1", createdN)
	}
}
