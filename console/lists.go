package console

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

// deadShown is how many dead letters a page of them shows.
const deadShown = 200

// deadPage lists the dead letters, newest first, deadShown a page, with
// replay and drop, and how many there are in all (the dead-letter
// stream's count, read from its info: a filter's matches are not
// counted, which would read them all).
func (c *Console) deadPage(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	q := r.URL.Query()
	f := queue.Filter{State: queue.StateDead, Dest: strings.TrimSpace(q.Get("dest")), Tenant: strings.TrimSpace(q.Get("tenant")), Newest: true}
	at, errs := pageOf(q)
	items, more, err := c.listPage(ctx, f, at, deadShown)
	if err != nil {
		errs = append(errs, err.Error())
	}
	total := int64(-1) // unknown
	if stats, err := c.cfg.Queue.LaneStats(ctx); err == nil {
		for _, st := range stats {
			if st.Lane == "dead" {
				total = int64(st.Depth)
			}
		}
	}
	first, next := pageLinks(Prefix+"dead", q, at, items, more)
	c.render(w, r, s, http.StatusOK, "dead", "Dead letters", map[string]any{"Filter": f, "Items": rows(items), "Errors": errs,
		"From": at.shown + 1, "To": at.shown + len(items), "Total": total, "First": first, "Next": next, "PageSize": deadShown,
		"Back": r.URL.RequestURI()})
}

// haveSuppressions says whether this daemon keeps a suppression list, and
// answers 404 itself when it does not.
func (c *Console) haveSuppressions(w http.ResponseWriter, r *http.Request, s *session) bool {
	if c.cfg.Suppressions == nil {
		c.fail(w, r, s, http.StatusNotFound, "This daemon has no suppression list.")
		return false
	}
	return true
}

// suppressionsShown is how many entries the suppressions page shows, and
// suppressionsScan how many it reads at most to find them (a source that
// few entries have).
const (
	suppressionsShown = 1000
	suppressionsScan  = 20 * suppressionsShown
)

// moreThan is the Total of a suppressions page that does not show the
// whole list: the page reads only what it shows, so how many more there
// are is not known. It compares as one more than shown and prints as
// "more than" them.
type moreThan int

func (n moreThan) String() string { return "more than " + strconv.Itoa(int(n)-1) }

// suppressionsPage is `outflow suppress list`, with add and remove: the
// first suppressionsShown entries written (of a tenant, of a source) from
// the position ?after= gives, in the order they were written (oldest
// first), with a link to the next ones; only they are read
// (queue.Suppressions.Page), not the whole list.
func (c *Console) suppressionsPage(w http.ResponseWriter, r *http.Request, s *session) {
	if !c.haveSuppressions(w, r, s) {
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	tenant := strings.TrimSpace(r.URL.Query().Get("tenant"))
	source := r.URL.Query().Get("source")
	var errs []string
	if source != "" && !slices.Contains(queue.SuppressionSources, source) {
		errs = append(errs, "no such source: "+source)
		source = ""
	}
	var from uint64
	if a := r.URL.Query().Get("after"); a != "" {
		v, err := strconv.ParseUint(a, 10, 64)
		if err != nil {
			errs = append(errs, "after: not a position in the list: "+a)
		}
		from = v
	}
	keep := func(e *queue.Suppression) bool { return source == "" || e.Source == source }
	list, next, err := c.cfg.Suppressions.Page(ctx, tenant, from, suppressionsShown, suppressionsScan, keep)
	if err != nil {
		errs = append(errs, err.Error())
	}
	// In the order written, as GET /v1/suppressions lists them: a page is
	// a stretch of the list from ?after=, so sorting it (by address, as
	// `suppress list` sorts the whole list) would interleave the pages'
	// addresses and an operator scanning for one would look on the wrong
	// page.
	var total any = len(list)
	if next != 0 {
		total = moreThan(len(list) + 1)
	}
	c.render(w, r, s, http.StatusOK, "suppressions", "Suppressions", map[string]any{"Tenant": tenant, "Source": source,
		"Sources": queue.SuppressionSources, "List": list, "Total": total, "Errors": errs, "Next": next, "From": from})
}

func (c *Console) suppressionAction(w http.ResponseWriter, r *http.Request, s *session) {
	if !c.haveSuppressions(w, r, s) {
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	f := r.PostForm
	tenant, addr := strings.TrimSpace(f.Get("tenant")), strings.TrimSpace(f.Get("address"))
	back := Prefix + "suppressions"
	if tenant == "" || addr == "" {
		c.fail(w, r, s, http.StatusBadRequest, "Both a tenant and an address are needed.")
		return
	}
	var msg string
	var err error
	switch r.PathValue("action") {
	case "add":
		// The check of `outflow suppress add` and POST /v1/suppressions:
		// an address that submission refuses (user@Bücher.example, without
		// SMTPUTF8) is no recipient any mail can have.
		if _, perr := submission.ParseAddress(addr); perr != nil {
			reason := perr.Error()
			var ae *submission.AddressError
			if errors.As(perr, &ae) {
				reason = ae.Reason
			}
			c.fail(w, r, s, http.StatusBadRequest, fmt.Sprintf("Address (address) %q: %s; nothing was stored.", short(addr, 254), reason))
			return
		}
		sup := queue.Suppression{Tenant: tenant, Address: addr, Reason: short(strings.TrimSpace(f.Get("reason")), 200), Source: queue.SuppressAdmin}
		if sup.Reason == "" {
			sup.Reason = "added from the console"
		}
		if v := strings.TrimSpace(f.Get("for")); v != "" {
			d, perr := positiveDuration(v)
			if perr != nil {
				c.fail(w, r, s, http.StatusBadRequest, "For (for): "+perr.Error()+"; nothing was stored.")
				return
			}
			sup.Expires = c.cfg.Now().Add(d).UTC().Truncate(time.Second)
		}
		err = c.cfg.Suppressions.Add(ctx, sup)
		msg = queue.NormalizeAddress(addr) + " suppressed for tenant " + tenant + "."
	case "remove":
		err = c.cfg.Suppressions.Remove(ctx, tenant, addr)
		msg = queue.NormalizeAddress(addr) + " is no longer suppressed for tenant " + tenant + "."
	default:
		c.fail(w, r, s, http.StatusNotFound, "No such action.")
		return
	}
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, queue.ErrNotSuppressed) {
			status = http.StatusNotFound
		}
		c.fail(w, r, s, status, err.Error())
		return
	}
	c.log.Info().Str("tenant", tenant).Str("action", r.PathValue("action")).Str("by", author(s)).Msg("console suppression change")
	c.done(w, r, s, back+"?tenant="+urlQueryEscape(tenant), msg)
}
