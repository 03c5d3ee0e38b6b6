package console

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/internal/destname"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// destsShown is how many rows the Destinations page shows at most.
const destsShown = 500

// destList is every destination with mail waiting or with shared state:
// those whose state is worth seeing (destRow.Notable) first, then those
// with mail waiting only, destsShown at most, of those whose name
// contains ?dest= when it is given.
func (c *Console) destList(w http.ResponseWriter, r *http.Request, s *session) {
	match := strings.ToLower(strings.TrimSpace(r.URL.Query().Get("dest")))
	rows, total, errs := c.destRows(r, destQuery{limit: destsShown, match: match, notableFirst: true})
	c.render(w, r, s, http.StatusOK, "dests", "Destinations", map[string]any{"Dests": rows, "Total": total, "Match": match, "Errors": errs})
}

// forDest is h for the request's {dest} as the shared state names it
// (destname.Check, the check of `outflow dest …`); a {dest} that is not a
// destination name is answered 400 without calling h.
func (c *Console) forDest(h func(w http.ResponseWriter, r *http.Request, s *session, dest string)) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		d, err := destname.Check(r.PathValue("dest"))
		if err != nil {
			c.fail(w, r, s, http.StatusBadRequest, "This is not a destination: "+err.Error())
			return
		}
		h(w, r, s, d)
	}
}

func (c *Console) destPage(w http.ResponseWriter, r *http.Request, s *session, dest string) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	var errs []string
	st, err := throttle.GetState(ctx, c.state, dest)
	if err != nil {
		errs = append(errs, err.Error())
	}
	now := c.cfg.Now()
	views, err := throttle.AskStatus(c.cfg.Queue, dest, c.cfg.StatusWait)
	if err != nil {
		errs = append(errs, err.Error())
	}
	deferred, err := c.cfg.Queue.List(ctx, queue.Filter{State: queue.StateDeferred, Dest: dest, Limit: 20})
	if err != nil {
		errs = append(errs, err.Error())
	}
	throttled, err := c.cfg.Queue.List(ctx, queue.Filter{State: queue.StateThrottled, Dest: dest, Limit: 20})
	if err != nil {
		errs = append(errs, err.Error())
	}
	row := destRow{Dest: dest, State: st, Suspended: st.Suspended(now), Breaker: st.BreakerAt(now)}
	if c.cfg.Local != nil {
		l := c.cfg.Local(dest)
		row.Local = &l
	}
	c.render(w, r, s, http.StatusOK, "dest", dest, map[string]any{
		"Dest": row, "Workers": views, "Deferred": rows(deferred), "Throttled": rows(throttled),
		"Bounces": c.rates.recentBounces(dest, 20), "Errors": errs,
	})
}

// destAction runs one of `outflow dest suspend|resume|rate|forget`.
func (c *Console) destAction(w http.ResponseWriter, r *http.Request, s *session, dest string) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	kv := c.state
	back := Prefix + "dests/" + url.PathEscape(dest)
	f := r.PostForm
	var msg string
	var err error
	switch r.PathValue("action") {
	case "suspend":
		d, perr := positiveDuration(f.Get("for"))
		if perr != nil {
			c.fail(w, r, s, http.StatusBadRequest, "Suspend, for (for): "+perr.Error()+"; nothing was changed.")
			return
		}
		reason := strings.TrimSpace(f.Get("reason"))
		if reason == "" {
			reason = "suspended from the console"
		}
		until := c.cfg.Now().Add(d)
		err = throttle.Suspend(ctx, kv, dest, until, short(reason, 200), author(s))
		msg = fmt.Sprintf("%s suspended until %s.", dest, until.UTC().Format(time.RFC3339))
	case "resume":
		var held bool
		held, err = throttle.Resume(ctx, kv, dest, author(s))
		msg = dest + " resumed; its deferred mail is released at its rate, oldest first."
		if !held {
			msg = dest + " was neither suspended nor held by its breaker: nothing to resume."
		}
	case "rate":
		rate, perr := messagesPerSecond(f.Get("max"))
		if perr != nil {
			c.fail(w, r, s, http.StatusBadRequest, "Set rate, at most (max): "+perr.Error()+"; nothing was changed.")
			return
		}
		var until time.Time
		if v := strings.TrimSpace(f.Get("for")); v != "" {
			d, perr := positiveDuration(v)
			if perr != nil {
				c.fail(w, r, s, http.StatusBadRequest, "Set rate, for (for): "+perr.Error()+"; nothing was changed.")
				return
			}
			until = c.cfg.Now().Add(d)
		}
		err = throttle.SetRate(ctx, kv, dest, rate, until, author(s))
		msg = fmt.Sprintf("%s: at most %g/s across the fleet.", dest, rate)
	case "rate-clear":
		// Said as `dest rate --clear` says it: a cap mistyped or cleared
		// already is not "removed".
		var before throttle.DestState
		if before, err = throttle.GetState(ctx, kv, dest); err == nil {
			msg = dest + " had no rate cap; nothing to clear."
			if before.RateOverride != 0 {
				err = throttle.SetRate(ctx, kv, dest, 0, time.Time{}, author(s))
				msg = dest + ": rate cap removed; the configured or learned rate applies again."
			}
		}
	case "forget":
		var had bool
		had, err = throttle.Forget(ctx, kv, dest, author(s))
		msg = dest + ": learned limits cleared."
		if !had {
			msg = dest + " had learned nothing."
		}
	default:
		c.fail(w, r, s, http.StatusNotFound, "No such action.")
		return
	}
	if err != nil {
		c.log.Warn().Err(err).Str("dest", dest).Str("action", r.PathValue("action")).Msg("console dest action")
		c.fail(w, r, s, http.StatusBadGateway, "The change was not made: "+err.Error())
		return
	}
	c.log.Info().Str("dest", dest).Str("action", r.PathValue("action")).Str("by", author(s)).Msg("console dest action")
	c.done(w, r, s, back, msg)
}

// minDuration is the shortest duration a form takes: a shorter one would
// end before the change reached the workers (within a second), and is a
// typo ("1ns", "30ms" for 30m).
const minDuration = time.Second

// positiveDuration parses a Go duration ("30m", "2h"), at least
// minDuration and at most a year.
func positiveDuration(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration: want one such as 30m or 2h", short(v, 40))
	}
	if d < minDuration || d > 366*24*time.Hour {
		return 0, fmt.Errorf("%s: want a duration of at least 1s and at most a year", d)
	}
	return d, nil
}

// maxRate bounds a rate typed into a form (messages per second).
const maxRate = 1e6

// messagesPerSecond parses a rate typed into a form: a number above 0 and
// at most maxRate (not NaN, not Inf, which ParseFloat takes).
func messagesPerSecond(v string) (float64, error) {
	v = strings.TrimSpace(v)
	rate, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0 || rate > maxRate {
		return 0, fmt.Errorf("%q: want messages per second, a number above 0 and at most %.0f", short(v, 40), float64(maxRate))
	}
	return rate, nil
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
