package queue

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Op is a kind of JetStream operation the queue makes on the delivery
// path, counted per Queue (Ops) and exported as
// outflow_jetstream_ops_total{op}. The counts say what one message costs
// the server: docs/benchmarks.md ("Where the microseconds go") divides
// them by the messages delivered.
type Op int

// The counted operations. A publish is counted per stream it goes to; a
// sync is one request for a group commit (queue/storesync.go), not an
// fsync.
const (
	OpPublishWork   Op = iota // an envelope on OUTFLOW_WORK (submission, replay)
	OpPublishBody             // a body chunk or info on the Object Store
	OpPublishLane             // a schedule or held envelope on OUTFLOW_RETRY / OUTFLOW_RATELIMIT
	OpPublishDead             // a dead letter
	OpPublishEvent            // an event on OUTFLOW_EVENTS
	OpSentGet                 // a SENT-bucket read (the AlreadyHandled check, a parts count, a per-message record)
	OpSentPut                 // a SENT-bucket write (the SENT marker, a parts count, a per-message record)
	OpDirectGet               // a direct get of a lane, dead-letter or body message
	OpAck                     // an acknowledgement of a work or lane message (confirmed, except after a SENT marker)
	OpFetch                   // a pull request for a batch of envelopes
	OpFetched                 // an envelope received by a pull
	OpSync                    // a wait for the group commit of acknowledged writes
	OpSuppressGet             // a suppression-list read (one per recipient at submission)
	OpLocalGet                // a SENT or suppression look-up answered "nothing stored" by the embedded server's store in process, no round trip (instore.go)
	OpPublishKeeper           // the work stream's block keeper, once per new block file (keeper.go)
	OpWake                    // a wake-up for a tenant's pull loops, core NATS, at most one a wakeGap per tenant (tenants.go)
	OpGivenBack               // a fetched envelope no worker took within half the ack wait, given back unstarted (a nak, lanes.go)
	numOps
)

var opNames = [numOps]string{
	OpPublishWork: "publish_work", OpPublishBody: "publish_body", OpPublishLane: "publish_lane",
	OpPublishDead: "publish_dead", OpPublishEvent: "publish_event", OpSentGet: "sent_get", OpSentPut: "sent_put",
	OpDirectGet: "direct_get", OpAck: "ack", OpFetch: "fetch", OpFetched: "fetched", OpSync: "sync",
	OpSuppressGet: "suppress_get", OpLocalGet: "local_get", OpPublishKeeper: "publish_keeper",
	OpWake: "wake", OpGivenBack: "given_back",
}

// String is the op's label value.
func (o Op) String() string { return opNames[o] }

// opCounts is a Queue's operation counters: one atomic add per operation,
// cheap beside the round trip it counts.
type opCounts [numOps]atomic.Uint64

func (q *Queue) count(o Op) { q.ops[o].Add(1) }

// Ops returns how many operations of each kind this Queue has made since
// Connect, by Op.String.
func (q *Queue) Ops() map[string]uint64 {
	m := make(map[string]uint64, numOps)
	for o := range numOps {
		m[o.String()] = q.ops[o].Load()
	}
	return m
}

// opsDesc describes outflow_jetstream_ops_total; DepthCollector reports it.
var opsDesc = prometheus.NewDesc("outflow_jetstream_ops_total",
	"JetStream operations made by this process's queue on the delivery path, by kind (a publish per stream, SENT-bucket reads and writes, direct gets, acks, pull requests, envelopes pulled, group-commit waits; local_get: a look-up the embedded server's store answered in process, without a round trip; wake: a core NATS wake-up for the workers pulling a tenant, no store).",
	[]string{"op"}, nil)

// collectOps sends the current counts to ch.
func (q *Queue) collectOps(ch chan<- prometheus.Metric) {
	for o := range numOps {
		ch <- prometheus.MustNewConstMetric(opsDesc, prometheus.CounterValue, float64(q.ops[o].Load()), o.String())
	}
}
