package queue

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The work stream's block keeper.
//
// The file store removes a block file once acks have emptied it; when
// that block is the stream's last (the one being written), it starts a new
// file and writes a tombstone into it (nats-server's
// fileStore.removeMsgBlock). The work stream drains whenever the workers
// catch up, many times a second under load, so at the default durability
// each drain cost a file created and one removed, and the next group
// commit a directory fsync for the new file's entry (storesync.go): about
// a sixth of the fsyncs per message (docs/benchmarks.md).
//
// A message no consumer takes keeps the last block from emptying. That is
// the keeper: an empty message on subjWorkKeeper, which no tenant's
// filter matches, published with a subject rollup so that the stream holds
// only the newest. The store syncer counts the work stream's block files
// it finds new (WorkBlocks); after a group commit that found one, the
// queue publishes a keeper into it, off the submission's path. A drain
// between a block's start and its keeper's arrival still replaces the
// block; after that, a block is left only when it fills. Only a queue
// whose syncer is the embedded server's StoreSyncer keeps blocks: it is
// the one whose fsyncs the replacements cost.
//
// Every count of the work lane leaves the keeper out (workState):
// Depth, LaneStats and the orphan check; the subject listings skip it.

// keeper is a queue's state for its keeper publishes.
type keeper struct {
	blocks interface{ WorkBlocks() uint64 } // nil: no keeper
	kept   atomic.Uint64                    // the WorkBlocks count the last keeper answered
	busy   atomic.Bool                      // a keeper publish is under way
}

// keeperTimeout bounds one keeper publish.
const keeperTimeout = 5 * time.Second

// keepWorkBlock publishes a keeper, in the background, when the syncer
// has found a work block file that the last keeper did not answer.
func (q *Queue) keepWorkBlock() {
	k := &q.keeper
	if k.blocks == nil {
		return
	}
	n := k.blocks.WorkBlocks()
	if n == k.kept.Load() || !k.busy.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer k.busy.Store(false)
		if err := q.publishKeeper(); err != nil {
			q.log.Debug().Err(err).Msg("work stream keeper")
			return
		}
		k.kept.Store(n)
	}()
}

// publishKeeper stores a keeper and, by its rollup, removes the one before.
func (q *Queue) publishKeeper() error {
	ctx, cancel := context.WithTimeout(context.Background(), keeperTimeout)
	defer cancel()
	m := nats.NewMsg(subjWorkKeeper)
	m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	q.count(OpPublishKeeper)
	_, err := q.js.PublishMsg(ctx, m, jetstream.WithExpectStream(StreamWork))
	return err
}

// workState is the work stream's envelope count and, with oldest, the
// time its oldest envelope was stored, the keeper left out.
func (q *Queue) workState(ctx context.Context, withOldest bool) (msgs uint64, oldest time.Time, err error) {
	s := q.lanes[LaneWork]
	for try := 0; ; try++ {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(subjWorkKeeper))
		if err != nil {
			return 0, time.Time{}, err
		}
		st := info.State
		kept := st.Subjects[subjWorkKeeper]
		if st.Msgs <= kept {
			return 0, time.Time{}, nil
		}
		msgs = st.Msgs - kept
		if !withOldest {
			return msgs, time.Time{}, nil
		}
		if kept == 0 {
			return msgs, st.FirstTime, nil
		}
		// The first message may be the keeper: read the first envelope.
		m, err := s.GetMsg(ctx, st.FirstSeq, jetstream.WithGetMsgSubject(workFilter("*", "*", "*")))
		switch {
		case err == nil:
			return msgs, m.Time, nil
		case errors.Is(err, jetstream.ErrMsgNotFound) && try < 2:
			// Acknowledged since the count: count again.
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return msgs, time.Time{}, nil
		default:
			return msgs, time.Time{}, fmt.Errorf("oldest envelope: %w", err)
		}
	}
}
