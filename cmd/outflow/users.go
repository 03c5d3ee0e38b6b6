package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/submission"
)

// pendingUsersPrefix names the directory under the data dir in which a
// first start keeps the account it generates until the daemon is up.
const pendingUsersPrefix = ".users-new-"

// generatedUsersHeader is the first line of the users file a first start
// writes (submission.EnsureUsersFile).
const generatedUsersHeader = "# outflow submission users:"

// pendingAccount is the account a first start generates when the data dir
// has no users file. It is written to a directory of its own under the data
// dir, and linked into place and printed only once the daemon is up
// (commit): a start that fails on a flag or on an address in use left a
// users file behind whose password it had printed just before its error,
// and the next start, finding the file, said nothing of it.
type pendingAccount struct {
	dir      string // the directory that holds the new file
	path     string // where it goes: DATA/users
	user     string
	password string
}

// usersFile is the users file: --users, or DATA/users (the one a first
// start generates there).
func (c *serveConfig) usersFile() string {
	if c.Users != "" {
		return c.Users
	}
	return filepath.Join(c.Data, submission.UsersFileName)
}

// loadUsers reads the users file: --users, or DATA/users. Without either,
// it generates an account and returns it as pending: the caller commits it
// once the daemon is up and discards it otherwise.
func loadUsers(c *serveConfig, log zerolog.Logger) (*submission.Users, *pendingAccount, error) {
	path := c.usersFile()
	if c.Users != "" {
		u, err := submission.LoadUsers(path)
		if err != nil {
			return nil, nil, usageError{usersFileError(err)}
		}
		return u, nil, nil
	}
	_, err := os.Stat(path)
	switch {
	case err == nil:
		u, err := submission.LoadUsers(path)
		if err != nil {
			return nil, nil, usageError{usersFileError(err)}
		}
		if generatedUsersFile(path) {
			// Its password was printed once, by the start that made it,
			// on a terminal or a log nobody may have kept.
			log.Info().Str("users_file", path).Str("user", submission.DefaultUser).
				Msg("submission account made by the first start (its password was printed then, and only then); to set a new one, " +
					"replace its line with the one `outflow passwd --user " + submission.DefaultUser + "` prints and reload (kill -HUP the daemon)")
		}
		return u, nil, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, nil, fmt.Errorf("users file: %w", err)
	}
	removeStalePending(c.Data, log)
	dir, err := os.MkdirTemp(c.Data, pendingUsersPrefix+"*")
	if err != nil {
		return nil, nil, fmt.Errorf("users file: %w", err)
	}
	p, _, user, password, err := submission.EnsureUsersFile(dir)
	if err == nil && password == "" {
		err = errors.New("no account generated")
	}
	var u *submission.Users
	if err == nil {
		u, err = submission.LoadUsers(p)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("users file: %w", err)
	}
	return u, &pendingAccount{dir: dir, path: path, user: user, password: password}, nil
}

// commit links the generated users file into place and prints the account
// to w: the one time its password is shown. A users file that appeared in
// the meantime (another start on the same data dir) is not replaced; the
// account this start took is then not the file's, and it stops.
func (p *pendingAccount) commit(w io.Writer) error {
	if p == nil {
		return nil
	}
	defer p.discard()
	if err := os.Link(filepath.Join(p.dir, submission.UsersFileName), p.path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("users file %s was created by another start while this one started; start again to use it", p.path)
		}
		return fmt.Errorf("users file: %w", err)
	}
	// Printed once, on the first start that comes up, so `make run` can
	// be tried at once; only the hash is stored.
	_, err := fmt.Fprintf(w, "outflow: created %s with one account\n  user:     %s\n  password: %s\n(this password is shown only now)\n", p.path, p.user, p.password)
	return err
}

// discard removes the account of a start that did not come up. It does
// nothing after commit, or on nil.
func (p *pendingAccount) discard() {
	if p != nil {
		os.RemoveAll(p.dir)
	}
}

// removeStalePending removes what a start killed before it came up (no
// deferred function ran) left of its pending account. A directory younger
// than an hour may be another start's, under way on the same data dir.
func removeStalePending(dataDir string, log zerolog.Logger) {
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), pendingUsersPrefix) {
			continue
		}
		if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < time.Hour {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
			log.Warn().Err(err).Str("dir", filepath.Join(dataDir, e.Name())).Msg("cannot remove an account a start left behind")
		}
	}
}

// generatedUsersFile says whether path is the users file a first start
// wrote, as it wrote it: its header, then the one account DefaultUser.
func generatedUsersFile(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	header, accounts, ours := false, 0, false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, generatedUsersHeader):
			header = true
		case line == "" || strings.HasPrefix(line, "#"):
		default:
			accounts++
			ours = strings.HasPrefix(line, submission.DefaultUser+":")
		}
	}
	return sc.Err() == nil && header && accounts == 1 && ours
}

// usersFileError adds to an error reading the users file how its lines are
// made, when the file was read and a line refused.
func usersFileError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("%w (each line is NAME:HASH, a bcrypt hash: `outflow passwd --user NAME` prints the line, reading the password on stdin)", err)
}
