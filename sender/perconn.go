package sender

import (
	"time"

	"github.com/outflow/outflow/classify"
)

// A server may take only so many messages on one connection and refuse
// the next MAIL with a 4xx, closing the connection: Yahoo's "421 Max
// message per connection reached, closing transmission channel", a
// "452 Too many messages on this connection". Nothing of the refused
// transaction was taken, so its recipients go at once on a fresh
// connection to the same host, rather than back to the queue for a retry
// minutes later; and the number the connection carried becomes the
// host's limit for the connections after it (learnedPerConn, kept for
// perConnKeep), so that the next ones end before the refusal instead of
// meeting it. Without this, 17 % of a busy destination's attempts met
// the refusal and were deferred.
//
// Only such a refusal teaches it: a 4xx to MAIL on a connection that
// carried messages before, which the classifier reads as a throttle of
// the connection (classify.ScopeConnection). A rate throttle or any other
// refusal at MAIL stays the session's failure (softSessionFailure), and
// no fresh connection follows it.

// perConnKeep is how long a learned limit of messages per connection is
// kept. Past it a connection carries messages up to the configured
// limits again, and a server whose limit was raised is not held to the
// old one; one that still refuses teaches it again, at the cost of one
// reconnect.
const perConnKeep = time.Hour

// perConnRetries bounds the fresh connections one Send opens after such
// refusals: a server that refuses every MAIL on a second connection too is
// not limiting connections.
const perConnRetries = 2

type learnedLimit struct {
	n     int
	until time.Time
}

// connLimited reports whether err, which ended a transaction on c as a
// soft session failure, is a server's limit of messages per connection,
// and if it is, learns it for c's pool key.
func (s *Sender) connLimited(c *client, err error, log *msgLog) bool {
	in := inputOf(err)
	carried := c.txs - 1 // c.txs counts the refused transaction
	if in.Stage != classify.StageMail || in.Code/100 != 4 || carried < 1 {
		return false
	}
	if r := s.cfg.Classifier.Classify(in); r.Class != classify.Throttled || r.Scope != classify.ScopeConnection {
		return false
	}
	if n := s.learnedPerConn(c.key); n == 0 || carried < n {
		s.cfg.perConn.Store(c.key, learnedLimit{n: carried, until: time.Now().Add(perConnKeep)})
		log.Info().Str("mx", c.host).Str("addr", c.addr).Int("msgs_per_conn", carried).Int("code", in.Code).Str("reply", in.Text).
			Dur("kept", perConnKeep).Msg("server refused the next message on a connection: its connections now carry at most this many, and the refused message goes on a fresh one")
	}
	return true
}

// learnedPerConn is the limit of messages per connection learned for
// pool key key, 0 for none (or one kept past perConnKeep).
func (s *Sender) learnedPerConn(key string) int {
	v, ok := s.cfg.perConn.Load(key)
	if !ok {
		return 0
	}
	l := v.(learnedLimit)
	if time.Now().After(l.until) {
		s.cfg.perConn.CompareAndDelete(key, v)
		return 0
	}
	return l.n
}

// applyLearned lowers c's limit of transactions to the one learned for
// its host, if any.
func (s *Sender) applyLearned(c *client) {
	if n := s.learnedPerConn(c.key); n > 0 && (c.limit == 0 || n < c.limit) {
		c.limit = n
	}
}
