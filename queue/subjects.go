package queue

import (
	"encoding/base64"
	"strings"

	"github.com/outflow/outflow/backoff"
)

// Subject layout. Every subject outflow uses starts with "outflow.".
//
//	outflow.work.<tenant>.<dest>.<id>         fresh envelopes (OUTFLOW_WORK)
//	outflow.work.~keep                        the work stream's block keeper, no envelope (keeper.go)
//	outflow.retry.sched.<dest>.<id>           retry-lane schedules (OUTFLOW_RETRY)
//	outflow.retry.due.<dest>.<id>             retry-lane envelopes that are due
//	outflow.ratelimit.sched.<dest>.<id>       rate-limit lane schedules (OUTFLOW_RATELIMIT)
//	outflow.ratelimit.due.<dest>.<id>         rate-limit lane envelopes that are due
//	outflow.retry.held.<dest>.<id>            unknown outcomes held for an operator (OUTFLOW_RETRY)
//	outflow.dead.<id>                         dead letters, one per id (OUTFLOW_DEAD)
//	outflow.events.<type>.<ts>.<is>           every outcome (OUTFLOW_EVENTS); ts, is: 2 and 3 hex digits of the tenant's and the id's hash (events.go)
//	outflow.events.<type>.<shard>             the same, as written before tenant shards; and keyed events (EventKeySubject)
//	outflow.ctl.sync                          core NATS: ask the daemon to sync streams (subjSync)
//	outflow.ctl.tenant                        core NATS: a tenant's work consumer was created (subjTenantKick)
//	outflow.ctl.wake                          core NATS: a tenant's work consumer has mail (subjWorkWake)
//	outflow.ctl.fired.<lane>.<dest>.<id>      core NATS: the lane's stream republishes each due message's headers (firedSubjects)
const (
	subjWorkPrefix = "outflow.work."
	// subjWorkKeeper: three tokens, where an envelope has five, and "~",
	// which Token never writes: no tenant's consumer filter matches it.
	subjWorkKeeper = "outflow.work.~keep"
	subjDeadPrefix = "outflow.dead."
	subjEvents     = "outflow.events."
)

// subjSync is the core NATS subject on which the daemon's syncer answers
// other processes (`outflow submit`, admin verbs): the request names the
// streams, comma-separated; an empty reply means synced, anything else is
// the error. It lies outside every stream's subjects.
const subjSync = "outflow.ctl.sync"

// subjRoom is the core NATS subject on which the daemon answers whether
// its embedded store has room for new mail (storeroom.go): an empty reply
// means room, anything else is the refusal, ErrNoRoom's text.
const subjRoom = "outflow.ctl.room"

// subjTenantKick is a core NATS subject: whoever creates a tenant's work
// consumer announces it there, so every worker starts pulling from it at
// once instead of at its next periodic look (a fresh tenant's first mail
// would otherwise wait up to that period).
const subjTenantKick = "outflow.ctl.tenant"

// subjWorkWake is a core NATS subject: whoever stores mail on the work
// stream names the tenant's consumer there afterwards (Queue.wake), so that
// a worker that is not pulling the tenant starts (tenants.go). The payload
// is the consumer's name.
const subjWorkWake = "outflow.ctl.wake"

// firedSubjects is where a deferred lane's stream republishes the headers
// of every message stored on its due subjects: a schedule that fired (or a
// release, a fast-forward). The daemon's syncer listens, so that a firing,
// which the server writes without a client waiting on it, is fsynced at
// once (storesync.go). It lies outside every stream's subjects.
func firedSubjects(l Lane) string { return "outflow.ctl.fired." + string(l) + ".>" }

// Lane names one of the three queues an envelope can wait in. The name is
// also the second token of the lane's subjects.
type Lane string

// The two deferred lanes take their names from package backoff, which
// defines them once with each lane's backoff parameters: backoff imports
// nothing of outflow's, so it cannot take them from here.
const (
	// LaneWork is fresh mail, straight from submission or replay.
	LaneWork Lane = "work"
	// LaneRetry holds envelopes deferred after a transient failure.
	LaneRetry Lane = backoff.LaneRetry
	// LaneRateLimit holds envelopes deferred because the destination
	// throttled us; its consumer is the slow lane.
	LaneRateLimit Lane = backoff.LaneRateLimit
)

// Subject builders. The ones that take a destination or tenant encode it
// with Token; the *Filter forms take tokens as they are, so that "*" (any one
// token) and ">" (the rest) can stand in for any of them.

func schedSubject(l Lane, dest, id string) string { return schedFilter(l, Token(dest), id) }

func dueSubject(l Lane, dest, id string) string { return dueFilter(l, Token(dest), id) }

func heldSubject(dest, id string) string { return heldFilter(Token(dest), id) }

func workSubject(tenant, dest, id string) string {
	return workFilter(Token(tenant), Token(dest), id)
}

func deadSubject(id string) string { return subjDeadPrefix + id }

// eventSubject is the subject of the events of type typ of tenant's
// envelope id.
func eventSubject(typ, tenant, id string) string {
	b := make([]byte, 0, len(subjEvents)+len(typ)+7)
	b = append(append(b, subjEvents...), typ...)
	b = appendShard(append(b, '.'), fnv32(tenant)%eventTenantShards, 2)
	b = appendShard(append(b, '.'), fnv32(id)%eventIDShards, 3)
	return string(b)
}

// historyFilters are the subject filters that hold every event of id,
// whatever its tenant: in the layout of tenant shards, then in the one
// before them (events.go). Each is read by a consumer of its own (History).
func historyFilters(id string) []string {
	return []string{subjEvents + "*.*." + eventIDShard(id), subjEvents + "*." + legacyEventShard(id)}
}

// tenantHistoryFilters are historyFilters for an id of tenant's: the id's
// shard in the tenant's shard only, and in the layout before tenant shards.
func tenantHistoryFilters(tenant, id string) []string {
	return []string{subjEvents + "*." + eventTenantShard(tenant) + "." + eventIDShard(id), subjEvents + "*." + legacyEventShard(id)}
}

func schedFilter(l Lane, destTok, id string) string {
	return "outflow." + string(l) + ".sched." + destTok + "." + id
}

func dueFilter(l Lane, destTok, id string) string {
	return "outflow." + string(l) + ".due." + destTok + "." + id
}

// heldFilter: held envelopes live in the retry lane's stream.
func heldFilter(destTok, id string) string {
	return "outflow." + string(LaneRetry) + ".held." + destTok + "." + id
}

func workFilter(tenantTok, destTok, id string) string {
	return subjWorkPrefix + tenantTok + "." + destTok + "." + id
}

// laneSubjects is everything a lane's stream holds: outflow.<lane>.>.
func laneSubjects(l Lane) string { return "outflow." + string(l) + ".>" }

// laneDueSubjects is what a deferred lane's consumer delivers.
func laneDueSubjects(l Lane) string { return "outflow." + string(l) + ".due.>" }

// tenantWorkSubjects is a tenant's fresh mail, tenantTok already encoded.
func tenantWorkSubjects(tenantTok string) string { return subjWorkPrefix + tenantTok + ".>" }

// Stream subjects of the dead letters and the events.
const (
	deadSubjects   = subjDeadPrefix + ">"
	eventsSubjects = subjEvents + ">"
)

// Token encodes s as a single NATS subject token. A domain's dots would
// split it into several tokens, and '*', '>' and white space are not allowed
// at all, so '.' becomes '_' and any byte outside [A-Za-z0-9-] (including a
// literal '_') becomes %XX. The encoding is reversible with Untoken.
func Token(s string) string {
	if s == "" {
		return "%00"
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !tokenSafe(s[i]) && s[i] != '.' {
			clean = false
			break
		}
	}
	if clean {
		return strings.ReplaceAll(s, ".", "_")
	}
	var b strings.Builder
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			b.WriteByte('_')
		case tokenSafe(c):
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		}
	}
	return b.String()
}

// Untoken reverses Token.
func Untoken(t string) string {
	if t == "%00" {
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(t); i++ {
		c := t[i]
		switch {
		case c == '_':
			b.WriteByte('.')
		case c == '%' && i+2 < len(t):
			b.WriteByte(unhex(t[i+1])<<4 | unhex(t[i+2]))
			i += 2
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func tokenSafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return 0
}

// The body bucket's subjects, in the Object Store's own layout (ADR-20), so
// that bodies.go's direct reads and writes stay readable by every Object
// Store client: chunks on $O.<bucket>.C.<nuid>, an object's info as the
// last message on $O.<bucket>.M.<base64url(name)>.
func bodyMetaSubject(name string) string {
	return "$O." + BucketBodies + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
}

func bodyChunkSubject(nuid string) string { return "$O." + BucketBodies + ".C." + nuid }

// bodyLeaderGetSubject is the JetStream API's message get on the body
// stream: unlike a direct get, only the stream's leader answers it.
const bodyLeaderGetSubject = "$JS.API.STREAM.MSG.GET." + bodyStreamName

// EventTypeFilter is the subject filter of every event of type typ, in
// both layouts (events.go), for a consumer on StreamEvents (the console's
// charts).
func EventTypeFilter(typ string) string { return subjEvents + typ + ".>" }

// EventTenantFilters are the subject filters of the events of type typ of
// tenant, for a consumer on StreamEvents: the events of tenant's shard,
// which a few other tenants may share (the consumer checks each event's
// tenant), and those written before tenant shards, which are every
// tenant's (events.go). Keyed events (EventKeySubject) fall outside them.
func EventTenantFilters(typ, tenant string) []string {
	return []string{subjEvents + typ + "." + eventTenantShard(tenant) + ".*", subjEvents + typ + ".*"}
}

// The subjects of the key-value buckets, in nats.go's key-value layout
// (ADR-8): bucket B is stream KV_B, and key K is stored on $KV.B.K.
func kvStream(bucket string) string { return "KV_" + bucket }

func kvSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// directGetSubject is the JetStream API's direct get of the last message
// on subject in stream: any replica answers it.
func directGetSubject(stream, subject string) string {
	return "$JS.API.DIRECT.GET." + stream + "." + subject
}

// deadID is the envelope id a dead letter's subject (deadSubject) names.
func deadID(subj string) string { return strings.TrimPrefix(subj, subjDeadPrefix) }

// workTenant is the tenant token of a work subject (workSubject).
func workTenant(subj string) string {
	tok, _, _ := strings.Cut(strings.TrimPrefix(subj, subjWorkPrefix), ".")
	return tok
}

// subjDestStatus is the core NATS subject on which every running worker
// answers `outflow dest status` with its view of a destination.
const subjDestStatus = "outflow.admin.dest.status"

// isDueSubject reports whether subj is a deferred lane's due subject
// (outflow.<lane>.due.<dest>.<id>): an envelope that has come due.
func isDueSubject(subj string) bool {
	for _, l := range []Lane{LaneRetry, LaneRateLimit} {
		if strings.HasPrefix(subj, "outflow."+string(l)+".due.") {
			return true
		}
	}
	return false
}

// EventKeySubject is the subject of an event of type typ filed under key
// (one subject token) instead of an envelope id's shard: the webhook
// replays, one subject per endpoint.
func EventKeySubject(typ, key string) string { return subjEvents + typ + "." + key }
