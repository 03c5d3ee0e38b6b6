package queue

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Bodies live in the Object Store bucket BucketBodies, in the Object
// Store's own format (ADR-20: chunks on $O.<bucket>.C.<nuid>, the object's
// info as the last message on $O.<bucket>.M.<base64url(name)>), so
// `nats object` and every Object Store client read them. The common case
// (a body of one chunk) is written and read here directly, without what
// nats.go's generic Put and Get cost per object: a look-up of the previous
// version, a 128 KiB chunk buffer and a private reply subscription per Put,
// and an ordered consumer created on the server for every Get, which
// profiles of the end-to-end benchmark show as a large share of the daemon's CPU
// time (docs/benchmarks.md). Anything else (empty or multi-chunk bodies, names
// that may exist already) goes through nats.go.

// bodyChunkSize is nats.go's default Object Store chunk size; a body up
// to this size is one chunk.
const bodyChunkSize = 128 << 10

// putNewBody stores body under a name that has never been used. It returns
// only when JetStream has acknowledged both the chunk and the object's
// info.
func (q *Queue) putNewBody(ctx context.Context, name string, body []byte) error {
	if len(body) == 0 || len(body) > bodyChunkSize || q.bodyStream == nil {
		return q.putBody(ctx, name, body)
	}
	id := nuid.Next()
	sum := sha256.Sum256(body)
	info := jetstream.ObjectInfo{
		ObjectMeta: jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: bodyChunkSize}},
		Bucket:     BucketBodies,
		NUID:       id,
		Size:       uint64(len(body)),
		Chunks:     1,
		Digest:     "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:]),
	}
	meta, err := json.Marshal(&info)
	if err != nil {
		return err
	}
	// Chunk and info go out back to back on the shared async publisher and
	// are acknowledged together: one round trip instead of four. The
	// stream stores them in order, so the info never names a missing
	// chunk.
	stream := jetstream.WithExpectStream(bodyStreamName)
	q.count(OpPublishBody)
	q.count(OpPublishBody)
	fc, err := q.js.PublishMsgAsync(&nats.Msg{Subject: bodyChunkSubject(id), Data: body}, stream)
	if err != nil {
		return err
	}
	mm := &nats.Msg{Subject: bodyMetaSubject(name), Header: nats.Header{jetstream.MsgRollup: []string{jetstream.MsgRollupSubject}}, Data: meta}
	fm, err := q.js.PublishMsgAsync(mm, stream)
	if err != nil {
		return err
	}
	if err := waitAcks(ctx, fc, fm); err != nil {
		// A chunk without info is invisible; remove it rather than leave
		// it until the bucket's TTL.
		_ = q.bodyStream.Purge(context.WithoutCancel(ctx), jetstream.WithPurgeSubject(bodyChunkSubject(id)))
		return err
	}
	return nil
}

// putBody stores body under name through nats.go's Object Store, which
// replaces an existing object of that name.
func (q *Queue) putBody(ctx context.Context, name string, body []byte) error {
	q.count(OpPublishBody)
	_, err := q.bodies.PutBytes(ctx, name, body)
	return err
}

// waitAcks waits for every future's acknowledgement.
func waitAcks(ctx context.Context, fs ...jetstream.PubAckFuture) error {
	for _, f := range fs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// bodyInfo reads an object's info with a direct get (no consumer).
func (q *Queue) bodyInfo(ctx context.Context, name string) (*jetstream.ObjectInfo, error) {
	q.count(OpDirectGet)
	m, err := q.bodyStream.GetLastMsgForSubject(ctx, bodyMetaSubject(name))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, jetstream.ErrObjectNotFound
		}
		return nil, err
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(m.Data, &info); err != nil {
		return nil, fmt.Errorf("object info: %w", err)
	}
	if info.Deleted {
		return nil, jetstream.ErrObjectNotFound
	}
	return &info, nil
}

// ErrBodyMissing matches, with errors.Is, the error of a body that is not
// stored: never written, deleted, or not yet seen by the replica that
// answered (BodyGone asks the leader which). Callers match it instead of
// nats.go's Object Store and stream sentinels, which it wraps.
var ErrBodyMissing = errors.New("body not stored")

// missingBody is a not-found error from the body bucket that also matches
// ErrBodyMissing; its text is the underlying error's.
type missingBody struct{ err error }

func (m missingBody) Error() string        { return m.err.Error() }
func (m missingBody) Unwrap() error        { return m.err }
func (m missingBody) Is(target error) bool { return target == ErrBodyMissing }

// Body fetches an envelope's message body. A body of one chunk takes two
// direct gets, its digest checked as the Object Store client would. A body
// that is not stored gives an error matching ErrBodyMissing.
func (q *Queue) Body(ctx context.Context, ref string) (_ []byte, err error) {
	defer func() {
		if errors.Is(err, jetstream.ErrObjectNotFound) || errors.Is(err, jetstream.ErrMsgNotFound) {
			err = missingBody{err}
		}
	}()
	if q.bodyStream != nil {
		info, err := q.bodyInfo(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("body %s: %w", ref, err)
		}
		if info.Chunks == 1 {
			q.count(OpDirectGet)
			m, err := q.bodyStream.GetLastMsgForSubject(ctx, bodyChunkSubject(info.NUID))
			if err != nil {
				return nil, fmt.Errorf("body %s: chunk: %w", ref, err)
			}
			sum := sha256.Sum256(m.Data)
			if uint64(len(m.Data)) != info.Size || "SHA-256="+base64.URLEncoding.EncodeToString(sum[:]) != info.Digest {
				return nil, fmt.Errorf("body %s: %w", ref, jetstream.ErrDigestMismatch)
			}
			q.bodyInfos.remember(ref, info)
			return m.Data, nil
		}
	}
	b, err := q.bodies.GetBytes(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("body %s: %w", ref, err)
	}
	return b, nil
}

// EnvelopeBody returns the body e delivers: its inline body, or the one it
// names in the Object Store.
func (q *Queue) EnvelopeBody(ctx context.Context, e *Envelope) ([]byte, error) {
	if e.Inline() {
		return e.Body, nil
	}
	return q.Body(ctx, e.BodyRef)
}

// PutBody stores a derived body (a DKIM-signed copy) under ref.
func (q *Queue) PutBody(ctx context.Context, ref string, body []byte) error {
	if err := q.putBody(ctx, ref, body); err != nil {
		return fmt.Errorf("store body %s: %w", ref, err)
	}
	// A schedule that names this copy is synced next; the copy must not
	// be the part a crash loses.
	if err := q.durable(ctx, bodyStreamName); err != nil {
		return fmt.Errorf("store body %s: %w", ref, err)
	}
	return nil
}

// releaseBody deletes a body once no envelope can need it again: its own
// copies (DKIM-signed, edited by a replay, or an edited one signed) always;
// the submitted original when this envelope is its only one, or the last
// of several to finish (see lastPart). It runs after the envelope's final
// acknowledgement, and by DropBy; an envelope dropped while a worker
// delivers it is released by both, so its count is taken once (countOnce).
func (q *Queue) releaseBody(ctx context.Context, e *Envelope) {
	if e.Inline() {
		return // it goes with the envelope's message
	}
	var refs []string
	if e.BodyRef != e.MsgID {
		refs = append(refs, e.BodyRef)
	}
	if e.Signed && e.Replays > 0 {
		refs = append(refs, EditedBodyRef(e)) // if it was edited before signing
	}
	if e.Parts <= 1 || q.countOnce(ctx, e) && q.lastPart(ctx, e.MsgID) {
		refs = append(refs, e.MsgID)
	}
	for _, ref := range refs {
		if err := q.deleteBody(ctx, ref); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			q.log.Debug().Err(err).Str("msg_id", e.MsgID).Msg("delete body")
		}
	}
}

// SignedBodyRef names the DKIM-signed copy of e's body that a worker
// stores when the signed message is too large to carry inline. A replayed
// envelope's copy has a name of its own: Replay deletes the copy the dead
// letter named only after the replayed envelope is published, and a worker
// may already have signed and stored the new one by then.
func SignedBodyRef(e *Envelope) string {
	ref := e.MsgID + ".dkim." + e.ID
	if e.Replays > 0 {
		ref += "." + itoa(e.Replays)
	}
	return ref
}

// EditedBodyRef names the copy of e's body that `queue replay
// --edit-headers` stores for e alone.
func EditedBodyRef(e *Envelope) string { return e.MsgID + ".edit." + e.ID }

// partsKey is the SENT-bucket key that counts the envelopes of a
// multi-domain submission still to finish. It cannot collide with a SENT
// marker (<envelope id>.<step>): no envelope id is "parts".
func partsKey(msgID string) string { return "parts." + msgID }

// countOnce reports whether e has not been counted out of its
// submission's parts before, and records that it now is: a key created
// once per envelope (and submission time, for a keyed id submitted again
// after its deduplication window). An error answers false, and the body
// waits for the bucket's TTL rather than go early.
func (q *Queue) countOnce(ctx context.Context, e *Envelope) bool {
	q.count(OpSentPut)
	_, err := q.sent.Create(ctx, markerKey("released", e.ID, e), nil)
	return err == nil
}

// lastPart counts one envelope of msgID's submission as finished and
// reports whether it was the last. Siblings finishing at once are
// serialized by the key's revision. Whenever the count cannot be read (no
// key: an older submission, a replay of a single-part message, an expired
// key) it answers false and the body waits for the bucket's TTL: a body is
// never deleted early. An envelope parked in dead letters does not count
// as finished, so its body stays for a replay.
func (q *Queue) lastPart(ctx context.Context, msgID string) bool {
	key := partsKey(msgID)
	for try := range 64 {
		if try > 0 {
			// A sibling counted first. Many finishing together (a large
			// message split per recipient) take turns: wait a moment,
			// each a different one, before reading again.
			t := time.NewTimer(time.Duration(1+rand.IntN(4*min(try, 8))) * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return false
			case <-t.C:
			}
		}
		q.count(OpSentGet)
		ent, err := q.sent.Get(ctx, key)
		if err != nil {
			return false
		}
		n, err := strconv.Atoi(string(ent.Value()))
		if err != nil {
			return false
		}
		if n <= 1 {
			_ = q.sent.Delete(ctx, key)
			return true
		}
		q.count(OpSentPut)
		_, err = q.sent.Update(ctx, key, []byte(strconv.Itoa(n-1)), ent.Revision())
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			// Counted, or failed in a way that may have counted (a
			// timeout): trying again could count this envelope twice
			// and delete a body a sibling still needs.
			return false
		}
	}
	return false
}

// deleteBody deletes a body: its info and its chunks, purged together,
// leaving nothing on either subject.
//
// The Object Store's own Delete rolls a deleted-marker info up over the
// old one and purges only the chunks, and this did the same: the marker
// then stayed for the bucket's TTL (19 days by default), one subject of
// the server's in-memory index per released body, some 19 million with a
// million multi-domain messages a day. No info is what a deleted body is
// to every reader here (bodyInfo, Body, BodyGone) and to nats.go's Object
// Store (ErrObjectNotFound either way), so the info subject is purged
// instead of marked. The marker protected nothing a purge does not: a
// reader that read the info before the purge finds its chunk gone
// (ErrBodyMissing), as it did after the marker; the purge removes only
// what is stored up to it, so a body written again under the name after
// it stays (with the marker it stayed too, the newer info rolled over the
// marker); and one written again between the info's read and the purge is
// removed, as the marker's rollup hid it (its chunk then waits for the
// bucket's TTL; see infoCache). Both purges are in flight together, as
// the marker's publish and the chunks' purge were.
func (q *Queue) deleteBody(ctx context.Context, name string) error {
	if q.bodyStream == nil {
		return q.bodies.Delete(ctx, name)
	}
	info := q.bodyInfos.take(name)
	if info == nil {
		var err error
		if info, err = q.bodyInfo(ctx, name); err != nil {
			return err
		}
	}
	q.count(OpPublishBody) // the info's purge, a write where the marker's publish was
	metaDone := make(chan error, 1)
	go func() {
		metaDone <- q.bodyStream.Purge(ctx, jetstream.WithPurgeSubject(bodyMetaSubject(name)))
	}()
	perr := q.bodyStream.Purge(ctx, jetstream.WithPurgeSubject(bodyChunkSubject(info.NUID)))
	if err := <-metaDone; err != nil {
		return err
	}
	return perr
}

// infoCache remembers the info of bodies read by this process until they
// are released, which saves deleteBody a read of the info it has just
// seen. Bounded: when full it starts again from empty, and a miss only
// costs the read. A body replaced under the same name (a DKIM re-sign after
// a crash) between read and release leaves the newer chunk to the bucket's
// TTL, never a live body deleted: the deleted marker is what hides an
// object, and it is written only at release.
type infoCache struct {
	mu sync.Mutex
	m  map[string]*jetstream.ObjectInfo
}

const infoCacheMax = 16384

func (c *infoCache) remember(name string, info *jetstream.ObjectInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= infoCacheMax {
		c.m = make(map[string]*jetstream.ObjectInfo, 1024)
	}
	c.m[name] = info
}

func (c *infoCache) take(name string) *jetstream.ObjectInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	info := c.m[name]
	delete(c.m, name)
	return info
}

// BodyGone asks the body stream's leader whether a body really is gone (no
// info, or a deleted marker). Body reads use direct gets, which any
// replica may answer; on a cluster, a replica that has not yet applied a
// just-written body answers "not found" for a body that exists. The leader's
// answer is the one that may send an envelope to dead letters.
func (q *Queue) BodyGone(ctx context.Context, ref string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := json.Marshal(map[string]string{"last_by_subj": bodyMetaSubject(ref)})
	if err != nil {
		return false, err
	}
	m, err := q.nc.RequestWithContext(ctx, bodyLeaderGetSubject, req)
	if err != nil {
		return false, fmt.Errorf("body %s at the stream leader: %w", ref, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return false, fmt.Errorf("body %s at the stream leader: %w", ref, err)
	}
	if resp.Error != nil {
		if resp.Error.Code == int(jetstream.JSErrCodeMessageNotFound) {
			return true, nil
		}
		return false, fmt.Errorf("body %s at the stream leader: %s", ref, resp.Error.Description)
	}
	if resp.Message == nil {
		return false, fmt.Errorf("body %s at the stream leader: empty answer", ref)
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(resp.Message.Data, &info); err != nil {
		return false, fmt.Errorf("body %s info: %w", ref, err)
	}
	return info.Deleted, nil
}

// BodyKeptUntil says when e's body expires with the Object Store's TTL,
// for an envelope whose body is stored apart; zero for one that carries
// its body. The TTL outlives every dead letter that can name the body,
// but not a message held (unknown) or kept waiting past it: replayed
// later, such a message finds its body gone.
func (q *Queue) BodyKeptUntil(ctx context.Context, e *Envelope) (time.Time, error) {
	if e.Inline() {
		return time.Time{}, nil
	}
	q.count(OpDirectGet)
	m, err := q.bodyStream.GetLastMsgForSubject(ctx, bodyMetaSubject(e.BodyRef))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return time.Time{}, jetstream.ErrObjectNotFound
		}
		return time.Time{}, err
	}
	return m.Time.Add(q.bodyStream.CachedInfo().Config.MaxAge), nil
}
