package submission

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"

	"github.com/outflow/outflow/queue"
)

// UsersFileName is the users file EnsureUsersFile creates in the data dir.
const UsersFileName = "users"

// DefaultUser is the account EnsureUsersFile generates on first start.
const DefaultUser = "outflow"

// maxPasswordBytes is bcrypt's limit: it ignores everything past 72 bytes,
// so longer passwords are refused rather than silently truncated.
const maxPasswordBytes = 72

// maxUserName bounds a user name; it becomes the tenant of every message.
const maxUserName = 255

// Users is the set of accounts allowed to AUTH: name to bcrypt hash. It is
// read-only after loading and safe for concurrent use; a reload makes a
// new one (Server.SetUsers).
type Users struct {
	hashes map[string][]byte
	// dummy is compared against for unknown names, at the highest cost in
	// the file, so that a miss takes as long as a hit.
	dummy func() []byte
}

// hash is name's bcrypt hash, nil for no such account.
func (u *Users) hash(name string) []byte { return u.hashes[name] }

// Diff compares u with older: the accounts added, removed, and whose hash
// changed (a new password), each sorted.
func (u *Users) Diff(older *Users) (added, removed, changed []string) {
	for name, h := range u.hashes {
		switch old, ok := older.hashes[name]; {
		case !ok:
			added = append(added, name)
		case !bytes.Equal(old, h):
			changed = append(changed, name)
		}
	}
	for name := range older.hashes {
		if _, ok := u.hashes[name]; !ok {
			removed = append(removed, name)
		}
	}
	slices.Sort(added)
	slices.Sort(removed)
	slices.Sort(changed)
	return added, removed, changed
}

// LoadUsers reads a users file: one "name:bcrypt-hash" per line; blank lines
// and lines starting with # are ignored. A malformed line, an invalid hash
// or a repeated name fails the whole load, naming the line.
func LoadUsers(path string) (*Users, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("submission: users file: %w", err)
	}
	defer f.Close()
	u, err := ParseUsers(f)
	if err != nil {
		return nil, fmt.Errorf("submission: users file %s: %w", path, err)
	}
	return u, nil
}

// ParseUsers reads the users file format from r (see LoadUsers).
func ParseUsers(r io.Reader) (*Users, error) {
	u := &Users{hashes: make(map[string][]byte)}
	maxCost := bcrypt.MinCost
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("line %d: expected name:bcrypt-hash", n)
		}
		if err := ValidateUserName(name); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		cost, err := bcrypt.Cost([]byte(hash))
		if err != nil {
			return nil, fmt.Errorf("line %d: user %q: not a bcrypt hash: %w", n, name, err)
		}
		maxCost = max(maxCost, cost)
		if _, dup := u.hashes[name]; dup {
			return nil, fmt.Errorf("line %d: user %q listed twice", n, name)
		}
		u.hashes[name] = []byte(hash)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", n+1, err)
	}
	u.dummy = sync.OnceValue(func() []byte {
		// Cannot fail for a short constant and a valid cost; if it did,
		// the nil hash makes every comparison fail, which is still safe.
		h, _ := bcrypt.GenerateFromPassword([]byte("outflow-unknown-user"), maxCost)
		return h
	})
	return u, nil
}

// ValidateUserName accepts 1 to 255 bytes of printable UTF-8 without
// spaces or colons (the users file separator), other than TrustedTenant
// and queue.PostmasterTenant: an account of that name would share its
// tenant (its suppression list, its sender domains, its fair share, its
// events) with the trusted networks' clients or the forwarded reports.
func ValidateUserName(name string) error {
	if name == "" {
		return errors.New("empty user name")
	}
	if name == TrustedTenant {
		return fmt.Errorf("user name %q is reserved: it is the tenant of mail from trusted networks", name)
	}
	if name == OtherTenants {
		return fmt.Errorf("user name %q is reserved: it names every tenant the sender policy does not name (sender-domains)", name)
	}
	if name == queue.PostmasterTenant {
		return fmt.Errorf("user name %q is reserved: it is the tenant of the postmaster and abuse mail forwarded to the operator", name)
	}
	if len(name) > maxUserName {
		return errors.New("user name longer than 255 bytes")
	}
	if !utf8.ValidString(name) {
		return errors.New("user name is not valid UTF-8")
	}
	for _, r := range name {
		if r == ':' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("user name contains %q", r)
		}
	}
	return nil
}

// Len is the number of accounts.
func (u *Users) Len() int {
	if u == nil {
		return 0
	}
	return len(u.hashes)
}

// Names returns the accounts' names, in no order.
func (u *Users) Names() []string {
	if u == nil {
		return nil
	}
	names := make([]string, 0, len(u.hashes))
	for name := range u.hashes {
		names = append(names, name)
	}
	return names
}

// Has reports whether name is an account. Used to decide whether a failed
// name may be logged: an unknown "name" is often a password typed into the
// wrong field.
func (u *Users) Has(name string) bool {
	if u == nil {
		return false
	}
	_, ok := u.hashes[name]
	return ok
}

// Verify reports whether password is name's password. An unknown name costs
// one bcrypt comparison too, so timing does not tell which names exist.
func (u *Users) Verify(name, password string) bool {
	if u == nil {
		return false
	}
	hash, ok := u.hashes[name]
	if !ok {
		hash = u.dummy()
	}
	if len(password) > maxPasswordBytes {
		// bcrypt would compare only the first 72 bytes; keep the cost,
		// refuse the match.
		_ = bcrypt.CompareHashAndPassword(hash, []byte(password[:maxPasswordBytes]))
		return false
	}
	return bcrypt.CompareHashAndPassword(hash, []byte(password)) == nil && ok
}

// HashPassword returns the bcrypt hash of password at cost (0 means
// bcrypt.DefaultCost, 10). Empty passwords and passwords over 72 bytes
// are refused.
func HashPassword(password string, cost int) (string, error) {
	if password == "" {
		return "", errors.New("submission: empty password")
	}
	if len(password) > maxPasswordBytes {
		return "", fmt.Errorf("submission: password longer than %d bytes, which bcrypt would truncate", maxPasswordBytes)
	}
	if cost == 0 {
		cost = bcrypt.DefaultCost
	}
	if cost < bcrypt.MinCost || cost > bcrypt.MaxCost {
		return "", fmt.Errorf("submission: bcrypt cost %d outside %d..%d", cost, bcrypt.MinCost, bcrypt.MaxCost)
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", fmt.Errorf("submission: hash password: %w", err)
	}
	return string(h), nil
}

// EnsureUsersFile makes sure dataDir holds a users file. If there is one
// already, it returns its path with created false. Otherwise it writes one,
// mode 0600, with a single account DefaultUser and a random password, and
// returns that password so the caller can print it once; it is stored
// nowhere else. Concurrent first starts are safe: exactly one creates the
// file (it is linked into place atomically), the others see it.
func EnsureUsersFile(dataDir string) (path string, created bool, user, password string, err error) {
	path = filepath.Join(dataDir, UsersFileName)
	if _, err := os.Stat(path); err == nil {
		return path, false, "", "", nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", false, "", "", fmt.Errorf("submission: users file: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", false, "", "", fmt.Errorf("submission: data dir: %w", err)
	}

	// 18 random bytes: 144 bits, 24 characters of URL-safe base64.
	raw := make([]byte, 18)
	if _, err := rand.Read(raw); err != nil {
		return "", false, "", "", fmt.Errorf("submission: random password: %w", err)
	}
	password = base64.RawURLEncoding.EncodeToString(raw)
	hash, err := HashPassword(password, 0)
	if err != nil {
		return "", false, "", "", err
	}
	content := "# outflow submission users: name:bcrypt-hash, one per line.\n" +
		"# Make a hash with: outflow passwd < password-file\n" +
		DefaultUser + ":" + hash + "\n"

	// Write a temporary file, then link it to the final name: the link
	// fails if the name exists, so a racing start never overwrites a file,
	// and a crash never leaves a half-written one.
	tmp, err := os.CreateTemp(dataDir, ".users-*")
	if err != nil {
		return "", false, "", "", fmt.Errorf("submission: users file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return "", false, "", "", fmt.Errorf("submission: users file: %w", err)
	}
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return "", false, "", "", fmt.Errorf("submission: users file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", false, "", "", fmt.Errorf("submission: users file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", false, "", "", fmt.Errorf("submission: users file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return path, false, "", "", nil
		}
		return "", false, "", "", fmt.Errorf("submission: users file: %w", err)
	}
	return path, true, DefaultUser, password, nil
}
