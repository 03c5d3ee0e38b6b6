package postfixinst

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Instance is a private Postfix instance prepared under Dir.
type Instance struct {
	Dir  string // etc/ (config), queue/ and data/ are under it
	Addr string // smtpd's listening address, host:port
}

// Conf is the instance's configuration directory, for postfix -c and
// postcat -c.
func (i *Instance) Conf() string { return filepath.Join(i.Dir, "etc") }

// Queue is the instance's queue directory.
func (i *Instance) Queue() string { return filepath.Join(i.Dir, "queue") }

// Command is postfix -c Conf() verb ("start", "start-fg", "stop", ...).
func (i *Instance) Command(verb string) (*exec.Cmd, error) {
	bin, err := LookPath("postfix")
	if err != nil {
		return nil, err
	}
	return exec.Command(bin, "-c", i.Conf(), verb), nil
}

// LookPath finds one of Postfix's programs on PATH or in /usr/sbin, where
// Debian installs them outside a root shell's PATH.
func LookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	p := filepath.Join("/usr/sbin", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not installed (Debian package postfix; make deps installs it)", name)
	}
	return p, nil
}

// Prepare writes an instance's configuration under dir with smtpd on
// addr, and makes its directories. main.cf holds what every private
// instance needs, then main's settings (a setting there replaces the
// default one of the same name); master.cf is the system's, with smtpd on
// addr, no other inet listener and no daemon chrooted (the private queue
// has no copy of /etc for a chroot).
func Prepare(dir, addr string, main map[string]string) (*Instance, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("postfix: a private instance must be started as root (Postfix's master runs as root and drops to the postfix user)")
	}
	if _, err := LookPath("postfix"); err != nil {
		return nil, err
	}
	inst := &Instance{Dir: dir, Addr: addr}
	data := filepath.Join(dir, "data")
	for _, d := range []string{inst.Conf(), inst.Queue(), data} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// The postfix user must reach its queue and data directories: open
	// the ones on the way (a test's temporary directory is 0700).
	for p := dir; p != os.TempDir() && p != "/" && p != "."; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			return nil, err
		}
	}
	// data_directory belongs to mail_owner; Postfix refuses anything else.
	u, err := user.Lookup("postfix")
	if err != nil {
		return nil, fmt.Errorf("postfix: no postfix user (Debian's postfix package makes it): %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(data, uid, gid); err != nil {
		return nil, err
	}
	master, err := masterCf(addr)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(inst.Conf(), "main.cf"), []byte(mainCf(dir, main)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(inst.Conf(), "master.cf"), []byte(master), 0o644); err != nil {
		return nil, err
	}
	return inst, nil
}

// mainCf is the whole main.cf of an instance under dir: Postfix's
// defaults except where a private instance must differ from a system one,
// then the caller's settings, sorted by name.
func mainCf(dir string, extra map[string]string) string {
	base := [][2]string{
		{"compatibility_level", "3.6"},
		{"queue_directory", filepath.Join(dir, "queue")},
		{"data_directory", filepath.Join(dir, "data")},
		{"mail_owner", "postfix"},
		{"setgid_group", "postdrop"},
		{"inet_interfaces", "127.0.0.1"},
		{"inet_protocols", "ipv4"},
		{"myhostname", "postfix.localdomain"},
		{"mydestination", ""},
		{"mynetworks", "127.0.0.0/8"},
	}
	var b strings.Builder
	for _, kv := range base {
		if _, ok := extra[kv[0]]; !ok {
			b.WriteString(kv[0] + " = " + kv[1] + "\n")
		}
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range extra {
			if !yield(k) {
				return
			}
		}
	}) {
		b.WriteString(k + " = " + extra[k] + "\n")
	}
	return b.String()
}

// masterCf is the system master.cf with the smtpd listener moved to addr,
// every other inet listener (submission, smtps) left out and chroot turned
// off.
func masterCf(addr string) (string, error) {
	b, err := os.ReadFile("/etc/postfix/master.cf")
	if err != nil {
		if b, err = os.ReadFile("/etc/postfix/master.cf.proto"); err != nil {
			return "", fmt.Errorf("postfix master.cf: %w", err)
		}
	}
	var out strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 8 && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, " ") {
			if f[0] == "smtp" && f[1] == "inet" {
				f[0] = addr
			}
			if f[1] == "inet" && f[0] != addr {
				continue
			}
			f[4] = "n"
			line = strings.Join(f, "\t")
		}
		out.WriteString(line + "\n")
	}
	return out.String(), nil
}

// RelayHost is the relayhost setting that sends everything to addr
// (host:port), without an MX lookup.
func RelayHost(addr string) string {
	h, p, _ := net.SplitHostPort(addr)
	return "[" + h + "]:" + p
}
