package main

import (
	"bytes"
	"fmt"
	"os"
)

// secretFileWarnings returns a line for the start's log for each file of
// secrets that every user of this host may read: the users file's
// password hashes, the TLS and DKIM private keys, the NATS credentials,
// and the config file when it holds relay-password. A DKIM key that any
// local user can read lets that user sign mail as the domain from
// anywhere. OpenSSH refuses such a private key; a warning is enough here,
// since a group of the daemon's own (0640) is a common deployment and is
// not flagged. Files that cannot be read are the loaders' errors, not
// this.
func (c *serveConfig) secretFileWarnings() []string {
	type secret struct{ what, path string }
	files := []secret{{"users file", c.Users}, {"tls-key", c.TLSKey}, {"api-tls-key", c.APITLSKey}, {"nats-creds", c.NATSCreds}}
	for _, k := range c.DKIM {
		files = append(files, secret{"[[dkim]] key-file of " + k.Domain, k.KeyFile})
	}
	if c.Config != "" {
		if data, err := os.ReadFile(c.Config); err == nil && bytes.Contains(data, []byte("relay-password")) {
			files = append(files, secret{"config file (relay-password)", c.Config})
		}
	}
	var out []string
	for _, f := range files {
		if f.path == "" {
			continue
		}
		st, err := os.Stat(f.path)
		if err != nil || st.Mode().Perm()&0o004 == 0 {
			continue
		}
		out = append(out, fmt.Sprintf("%s %s is readable by every user of this host (mode %04o): chmod o-rwx %s", f.what, f.path, st.Mode().Perm(), f.path))
	}
	return out
}
