// Package tlsrpt is in charge of SMTP TLS reporting (RFC 8460) on the
// sending side: it counts, per policy domain and policy, the TLS sessions
// that succeeded and the ones that failed (by result type, receiving MX
// host and address), and once a UTC day turns the counts into the JSON
// report of RFC 8460 4.4. A report is written to a directory, posted
// gzipped (application/tlsrpt+gzip) to the https "rua" addresses of the
// domain's "_smtp._tls" TXT record, or both. Reports by mail ("mailto:"
// rua) are not sent yet.
//
// The counts live in memory and are saved to a state file, and read back
// when the process starts, so that a restart within a day does not split
// or lose that day's report. The file is saved every few minutes while the
// counts change (Config.SaveInterval, what a crash loses at most), when a
// finished day is flushed, before its reports are posted (so that a crash
// after a POST does not post that day again under the same report-id), and
// when the process stops; each save replaces the file atomically and
// durably.
package tlsrpt
