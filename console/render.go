package console

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
)

// page is what every template gets.
type page struct {
	Title   string
	Nav     string // the menu entry to mark
	CSRF    string
	Signed  string // who is signed in ("key 3f2a… (ops)")
	Flash   string
	Refresh int // the live tables' poll period in seconds
	// Now is when the page (or a live refresh's fragment) was rendered:
	// each live block says "updated" with it, and the script says how old
	// it is when the refreshes stop.
	Now  time.Time
	Data any
}

var funcs = template.FuncMap{
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return roundDur(time.Since(t)) + " ago"
	},
	"in": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		d := time.Until(t)
		if d <= 0 {
			return "now"
		}
		return "in " + roundDur(d)
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	// clock is a time of day, UTC, as the live blocks' "updated" shows it.
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05Z") },
	"iso":   func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"ms": func(ms int64) string {
		if ms == 0 {
			return "-"
		}
		return roundDur(time.Duration(ms) * time.Millisecond)
	},
	"rate": func(r float64) string {
		if r <= 0 {
			return "unlimited"
		}
		return fmt.Sprintf("%.3g/s", r)
	},
	"dash": func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	},
	// pathEsc makes one path segment of a destination or id.
	"pathEsc": url.PathEscape,
	"query":   url.QueryEscape,
	// cls makes a CSS class of a state word ("breaker open").
	"cls": func(s string) string { return strings.ReplaceAll(s, " ", "-") },
}

// roundDur prints a duration to about three significant figures.
func roundDur(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	case d >= time.Hour:
		return d.Round(time.Minute).String()
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// parsePages parses each page template together with the layout.
func parsePages() (map[string]*template.Template, error) {
	// The layout and the partials (_*.html) are shared by every page.
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/_*.html")
	if err != nil {
		return nil, fmt.Errorf("console templates: %w", err)
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(path.Base(n), ".html")
		if base == "layout" || strings.HasPrefix(base, "_") {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("console template %s: %w", n, err)
		}
		out[base] = t
	}
	return out, nil
}

// render writes page name with data, or, for a live refresh
// (?fragment=1), only its "live" block.
func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, status int, name, title string, data any) {
	t := c.pages[name]
	p := page{Title: title, Nav: name, Data: data, Refresh: int(c.cfg.Refresh / time.Second), Now: c.cfg.Now()}
	if s != nil {
		p.CSRF = s.csrf
		p.Signed = "key " + s.info.ID + " (" + s.info.Tenant + ")"
		if r.URL.Query().Get("fragment") == "" {
			p.Flash = s.takeFlash()
		}
	}
	root := "page"
	if r.URL.Query().Get("fragment") != "" && t.Lookup("live") != nil {
		root = "live"
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, root, p); err != nil {
		c.log.Error().Err(err).Str("page", name).Msg("console template")
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	c.render(w, r, s, status, "error", http.StatusText(status), map[string]any{"Status": status, "Message": msg})
}

// done records a notice for the next page and redirects there (POST,
// then redirect, then GET: a reload does not repeat the action).
func (c *Console) done(w http.ResponseWriter, r *http.Request, s *session, to, msg string) {
	s.setFlash(msg)
	http.Redirect(w, r, to, http.StatusSeeOther)
}

// author names who made a change from the console, for the shared state's
// UpdatedBy and the logs.
func author(s *session) string { return "console:" + s.info.ID + "(" + s.info.Tenant + ")" }
