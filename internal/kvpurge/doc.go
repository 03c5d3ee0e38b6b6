// Package kvpurge deletes JetStream key-value entries so that nothing of
// them stays in the bucket's stream for good.
//
// A KV Delete (or Purge) leaves a marker message on the key's subject, and
// a Delete keeps the key's earlier revisions as well. In a bucket whose
// keys come and go (a destination's throttle state, a lifted suppression)
// every key ever deleted would stay, and every watcher that starts would
// read its marker again. Marker TTLs (NATS 2.11's LimitMarkerTTL) would
// expire them, but turning them on changes the bucket's stream for good
// (AllowMsgTTL cannot be turned off), and a daemon of the release before
// could then no longer open the bucket: no rolling upgrade, no rollback.
// So this package removes messages with a stream purge of the key's
// subject bounded by a sequence, which leaves any later write alone and
// publishes nothing:
//
//   - Purge is the KV purge (the history goes, one marker stays) for a
//     bucket whose watchers must learn of the deletion; DropThrough then
//     removes the marker once they have had the time to.
//   - DropThrough alone deletes an entry without any marker, for a bucket
//     nobody watches (its readers look keys up).
package kvpurge
