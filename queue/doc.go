// Package queue is in charge of outflow's durable state on NATS JetStream:
// it starts the embedded server (or connects to an external cluster), creates
// the streams, buckets and consumers, stores submitted message bodies once in
// an Object Store, splits each submission into one envelope per destination
// (per recipient for a message whose header names its recipient, its
// unsubscribe link: Submission.ListUnsubscribe), and carries envelopes between the three delivery lanes (fresh work, retry,
// rate limit), the dead-letter store and the events stream.
//
// Failure semantics, in one paragraph: a submission is accepted only once its
// body and every envelope are acknowledged by JetStream. A worker that pulls
// an envelope finishes it with exactly one durable step: Ack (delivered or
// bounced, after the SENT marker or bounce event is stored), Reschedule
// (publish a message schedule on the retry or rate-limit lane with a
// deduplication id of envelope id and attempt, wait for its ack, then ack the
// original), or Dead (store the envelope and its evidence in dead letters,
// then ack), or ToWork (a message sent later whose time has come: its copy
// on the work lane, then ack). A crash between the two halves of any step redelivers the
// original; deduplication and the SENT marker absorb the repeat, so nothing is
// lost and nothing is sent twice because of our own retry. Deferred envelopes
// are ordinary stored messages (JetStream message schedules), never
// NAK-with-delay, so ack-pending holds only what is really in flight.
// Each of those steps writes the envelope again; the top-level JSON fields
// of a release that knows more than this one are kept as they came
// (Envelope.unknown), so workers of two releases can share the lanes.
//
// "Acknowledged by JetStream" is not "on disk" on a single server: with
// --durability disk, each of those writes also waits for a group-committed
// fsync of its stream before the step reports done (storesync.go,
// durable.go), and a schedule the server fires is fsynced within a group
// commit of its republish, or by the lanes' one-second sweep. With that
// syncer, the work stream also holds one message that is not an envelope,
// the keeper, so that the stream draining does not make the file store
// replace its last block file each time (keeper.go); every count of the
// work lane leaves it out.
//
// The work lane has one consumer per tenant, and a worker process pulls a
// tenant only while it has mail: whoever stores mail sends a wake-up on core
// NATS after the store, and a periodic look at the consumers' pending
// counts finds what a lost wake-up would leave (tenants.go). So tenants that
// are not sending cost no goroutine and no waiting pull request, and the
// pulls share the process's buffer among the tenants that are. A tenant's
// pull hands an envelope to a delivery slot only when the caller's
// Admission (WithAdmission: the worker pool's share of slots per tenant)
// admits the tenant, and waits meanwhile while the others go on
// (admission.go); the shared retry and rate-limit lanes do not ask. A tenant's
// consumer unpulled for a day is removed by the server and made again by
// the tenant's next mail. Setup gives every tenant's consumer that exists
// the process's ack wait, replicas and MaxAckPending, as it does the
// lanes' consumers, and a Delivery says the ack wait of the consumer it
// came from (AckWait, ackwait.go), which the worker's keep-alive follows:
// the server goes by the consumer's, which the last daemon started set.
//
// The same in-process access answers the two look-ups every message makes,
// the suppression check at RCPT and the SENT check before a send, when
// they find nothing, as they nearly always do: the embedded server's store
// is asked directly, without a request through the server (instore.go).
// Anything found, and every look-up over a socket, is a direct get.
//
// Besides SENT markers, the SENT bucket holds small compare-and-set records
// that several envelopes or processes share (notices.go, bodies.go): the
// count of a multi-part submission's envelopes still holding its body, the
// first-pass and delay records through which those envelopes send one
// delivery status notification per message and event (RecordPass,
// ClosePass, NoteDelay), the deadlines of first passes left open, which
// any process takes up (WaitPass, PassWaits), the fleet-wide
// allowance of notifications per address (TakeAllowance), and the record
// of each idempotency key (`idem.<hash>`: when the key was first used,
// part of its message id, and the ids of a keyed message held for later;
// enqueue.go, keyedRecord). The per-tenant
// suppression list that submission checks is a bucket of queue's too
// (suppress.go).
//
// The events stream is read three ways: by envelope (History, the id's
// shard of subjects), by type and tenant for consumers that follow it
// (webhooks, the console), and by recipient (FindEvents, find.go), which
// reads through a stretch of it, since nothing indexes recipients.
//
// queue knows JetStream and nothing of SMTP. It owns the layout: every
// subject is built in subjects.go, every stream and consumer is configured
// here, and the packages above reach NATS only through Queue's methods
// (control.go for the few that are not about envelopes), never through the
// connection itself. Packages that keep state of their own (throttle, api,
// webhook) open their buckets through KeyValue, laid out like queue's.
package queue
