package unsubscribe

import "html/template"

// The kinds of page the handler answers with.
const (
	pageConfirm = "confirm" // GET: asks to confirm with a button
	pageDone    = "done"    // POST recorded
	pageRetry   = "retry"   // POST not recorded (503): the button again
	pageInvalid = "invalid" // the token does not open (404)
)

// page is what a page shows: its kind and the address the link names.
type page struct {
	Kind string
	Addr string
}

// pages renders every page: one small document, its style inline (the
// Content-Security-Policy allows nothing else), no script and nothing
// fetched from elsewhere. The form has no action: it posts back to the
// URL the page was fetched at, with the field an RFC 8058 client sends.
var pages = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="robots" content="noindex">
<title>{{if eq .Kind "done"}}Unsubscribed{{else if eq .Kind "invalid"}}Link not valid{{else}}Unsubscribe{{end}}</title>
<style>
body{margin:0;padding:12vh 1rem 2rem;background:#f3f4f6;color:#1f2328;font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:30rem;margin:0 auto;padding:2rem;background:#fff;border-radius:10px;box-shadow:0 1px 3px rgba(0,0,0,.12)}
h1{margin:0 0 .75rem;font-size:1.3rem;line-height:1.35;overflow-wrap:anywhere}
p{margin:0 0 1.25rem;color:#57606a}
p:last-child{margin-bottom:0}
button{padding:.6rem 1.5rem;border:0;border-radius:6px;background:#1f6feb;color:#fff;font:inherit;font-weight:600;cursor:pointer}
button:hover,button:focus{background:#1858c4}
</style>
</head>
<body>
<main>
{{- if eq .Kind "confirm"}}
<h1>Unsubscribe {{.Addr}} from these messages?</h1>
<p>The sender will stop mailing this address.</p>
{{- template "form"}}
{{- else if eq .Kind "done"}}
<h1>{{.Addr}} is unsubscribed</h1>
<p>Mail from this sender will no longer go to this address. You can close this page.</p>
{{- else if eq .Kind "retry"}}
<h1>Try again in a moment</h1>
<p>Unsubscribing {{.Addr}} could not be recorded just now.</p>
{{- template "form"}}
{{- else}}
<h1>This unsubscribe link is not valid</h1>
<p>It may have been cut short when it was copied. Try the link in the message again.</p>
{{- end}}
</main>
</body>
</html>
{{define "form"}}
<form method="post">
<input type="hidden" name="List-Unsubscribe" value="One-Click">
<button type="submit">Unsubscribe</button>
</form>
{{- end}}`))
