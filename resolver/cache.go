package resolver

import (
	"container/list"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// answer is what one query taught us about a name and type: the records of
// that type (CNAMEs followed by the server), or a negative answer.
type answer struct {
	rrs      []dns.RR
	notFound bool // NXDOMAIN or NODATA
	nxdomain bool
	ad       bool   // the AD bit of the response
	server   string // which server answered, for error messages
	expires  time.Time
	// target is the name the records are at: the question's name, or the
	// end of the CNAME chain the server followed (lower-case FQDN).
	target string
}

type cacheKey struct {
	name  string // lower-case FQDN
	qtype uint16
}

// cache is a TTL cache bounded in entries; when full, the least recently
// used entry goes. Expired entries are dropped when met.
type cache struct {
	mu    sync.Mutex
	max   int
	ll    *list.List // front = most recently used; values are *cacheEntry
	items map[cacheKey]*list.Element
}

type cacheEntry struct {
	key cacheKey
	ans *answer
}

func newCache(max int) *cache {
	return &cache{max: max, ll: list.New(), items: map[cacheKey]*list.Element{}}
}

// get returns the live answer for k, if any.
func (c *cache) get(k cacheKey, now time.Time) *answer {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[k]
	if !ok {
		return nil
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.ans.expires) {
		c.ll.Remove(el)
		delete(c.items, k)
		return nil
	}
	c.ll.MoveToFront(el)
	return e.ans
}

func (c *cache) put(k cacheKey, a *answer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		el.Value.(*cacheEntry).ans = a
		c.ll.MoveToFront(el)
		return
	}
	c.items[k] = c.ll.PushFront(&cacheEntry{key: k, ans: a})
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.items, old.Value.(*cacheEntry).key)
	}
}

func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ll.Len()
}
