package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// maxDestName bounds a destination in a URL: a domain is at most 253.
const maxDestName = 255

func (c *Console) destList(w http.ResponseWriter, r *http.Request, s *session) {
	rows, errs := c.destRows(r, 500)
	c.render(w, r, s, http.StatusOK, "dests", "Destinations", map[string]any{"Dests": rows, "Errors": errs})
}

// forDest is h for the request's {dest}, lower-cased; a {dest} that is
// not a destination name is answered 400 without calling h.
func (c *Console) forDest(h func(w http.ResponseWriter, r *http.Request, s *session, dest string)) func(http.ResponseWriter, *http.Request, *session) {
	return func(w http.ResponseWriter, r *http.Request, s *session) {
		d := strings.ToLower(strings.TrimSpace(r.PathValue("dest")))
		if d == "" || len(d) > maxDestName || strings.ContainsAny(d, " \t\r\n*>/") {
			c.fail(w, r, s, http.StatusBadRequest, fmt.Sprintf("%q is not a destination", d))
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
			c.fail(w, r, s, http.StatusBadRequest, "Suspend for: "+perr.Error())
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
		rate, perr := strconv.ParseFloat(strings.TrimSpace(f.Get("max")), 64)
		if perr != nil || rate <= 0 || rate > 1e6 {
			c.fail(w, r, s, http.StatusBadRequest, "Rate: want messages per second above 0.")
			return
		}
		var until time.Time
		if v := strings.TrimSpace(f.Get("for")); v != "" {
			d, perr := positiveDuration(v)
			if perr != nil {
				c.fail(w, r, s, http.StatusBadRequest, "Rate for: "+perr.Error())
				return
			}
			until = c.cfg.Now().Add(d)
		}
		err = throttle.SetRate(ctx, kv, dest, rate, until, author(s))
		msg = fmt.Sprintf("%s: at most %g/s across the fleet.", dest, rate)
	case "rate-clear":
		err = throttle.SetRate(ctx, kv, dest, 0, time.Time{}, author(s))
		msg = dest + ": rate cap removed; the configured or learned rate applies again."
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

// positiveDuration parses a Go duration ("30m", "2h"), above zero and at
// most a year.
func positiveDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return 0, errors.New("want a duration such as 30m or 2h")
	}
	if d <= 0 || d > 366*24*time.Hour {
		return 0, errors.New("want a duration above 0 and at most a year")
	}
	return d, nil
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
