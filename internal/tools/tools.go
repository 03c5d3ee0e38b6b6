//go:build tools

package tools

import (
	_ "github.com/BurntSushi/toml"
	_ "github.com/chromedp/chromedp"
	_ "github.com/emersion/go-msgauth/dkim"
	_ "github.com/emersion/go-sasl"
	_ "github.com/emersion/go-smtp"
	_ "github.com/foxcpp/go-mockdns"
	_ "github.com/hanwen/go-fuse/v2/fs"
	_ "github.com/miekg/dns"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/rs/zerolog"
	_ "github.com/spf13/cobra"
	_ "golang.org/x/crypto/bcrypt"
)
