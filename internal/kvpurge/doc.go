// Package kvpurge deletes a JetStream key-value entry so that nothing of it
// stays: a purge (its earlier revisions go with it) whose marker expires.
//
// A KV Delete leaves the key's history and a marker for good: in a bucket
// whose keys come and go (a destination's throttle state, a suppression
// lifted), every key ever deleted would stay in the stream, and every
// watcher that starts would read its marker again. The marker itself must
// stay a while, for the watchers that follow the bucket to learn of the
// deletion; its TTL needs the bucket's LimitMarkerTTL (NATS 2.11 and
// later).
package kvpurge
