package console

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/outflow/outflow/queue"
)

// The console pages the listings of the queue and dead-letter pages
// itself, since queue.Filter has no cursor. A page's next link carries
// the position of its last row (after=) and how many rows the pages so
// far showed (shown=); the next page lists from the start again with room
// for those rows and itself, and keeps the rows past the position. A row
// is placed by its position, not by a count, so rows that left the
// listing meanwhile (replayed, dropped, delivered) or joined it ahead of
// the position (a new dead letter, newest first) neither hide nor repeat
// the rows that follow. The cost: a page far down a long listing reads
// every row before it.

// maxShown bounds shown=, the rows a page link says came before it.
const maxShown = 10_000_000

// position is a row's place in the order queue.List walks a listing: its
// state's place in queue.States, then 1 for a due envelope of the
// deferred and throttled states (their scheduled envelopes are read
// first), then its sequence in its stream. Newest first (dead letters)
// is by sequence alone, from the end.
type position struct {
	state, phase int
	seq          uint64
}

func positionOf(it queue.Item) position {
	p := position{state: slices.Index(queue.States, it.State), seq: it.Seq}
	if it.Due && (it.State == queue.StateDeferred || it.State == queue.StateThrottled) {
		p.phase = 1
	}
	return p
}

// String is the position as a page link carries it.
func (p position) String() string { return fmt.Sprintf("%d.%d.%d", p.state, p.phase, p.seq) }

func parsePosition(s string) (position, error) {
	parts := strings.Split(s, ".")
	bad := fmt.Errorf("after: %q is not a position in the listing (start again from the first page)", short(s, 40))
	if len(parts) != 3 {
		return position{}, bad
	}
	st, err1 := strconv.Atoi(parts[0])
	ph, err2 := strconv.Atoi(parts[1])
	seq, err3 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || st < 0 || st >= len(queue.States) || ph < 0 || ph > 1 {
		return position{}, bad
	}
	return position{state: st, phase: ph, seq: seq}, nil
}

// before reports whether a row at p comes before one at q in a listing
// (newest: newest first).
func (p position) before(q position, newest bool) bool {
	if newest {
		return p.seq > q.seq
	}
	return cmp.Or(cmp.Compare(p.state, q.state), cmp.Compare(p.phase, q.phase), cmp.Compare(p.seq, q.seq)) < 0
}

// pageAt is where a page of a listing starts: past after (nil: at the
// start), with shown rows before it.
type pageAt struct {
	after *position
	shown int
}

// pageOf reads after= and shown= of a page link; a bad one is reported
// and the listing starts at the top.
func pageOf(q url.Values) (pageAt, []string) {
	var at pageAt
	v := q.Get("after")
	if v == "" {
		return at, nil
	}
	p, err := parsePosition(v)
	if err != nil {
		return at, []string{err.Error()}
	}
	at.after = &p
	if n, err := strconv.Atoi(q.Get("shown")); err == nil && n > 0 {
		at.shown = min(n, maxShown)
	}
	return at, nil
}

// listPage lists the first n rows of f (its Limit is ignored) past
// at.after, and whether more follow.
func (c *Console) listPage(ctx context.Context, f queue.Filter, at pageAt, n int) ([]queue.Item, bool, error) {
	want := n + 1
	if at.after != nil {
		want += at.shown
	}
	for {
		f.Limit = want
		items, err := c.cfg.Queue.List(ctx, f)
		var out []queue.Item
		for _, it := range items {
			if at.after == nil || at.after.before(positionOf(it), f.Newest) {
				out = append(out, it)
			}
		}
		if err != nil || len(out) > n || len(items) < want {
			more := len(out) > n
			if more {
				out = out[:n]
			}
			return out, more, err
		}
		want *= 2 // more rows before the position than shown= said
	}
}

// pageLinks are a page's links to the first and the next page of its
// listing (q: the page's query, its filters): "" when there is none.
func pageLinks(path string, q url.Values, at pageAt, items []queue.Item, more bool) (first, next string) {
	q = cloneQuery(q)
	q.Del("after")
	q.Del("shown")
	q.Del("fragment")
	if at.after != nil {
		first = path + "?" + q.Encode()
	}
	if more && len(items) > 0 {
		q.Set("after", positionOf(items[len(items)-1]).String())
		q.Set("shown", strconv.Itoa(at.shown+len(items)))
		next = path + "?" + q.Encode()
	}
	return first, next
}

// cloneQuery copies a query.
func cloneQuery(q url.Values) url.Values {
	out := url.Values{}
	for k, v := range q {
		out[k] = slices.Clone(v)
	}
	return out
}
