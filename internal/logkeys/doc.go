// Package logkeys holds no code: its test reads every log call in the
// repository and checks that each key is written with one JSON type
// (a log store that types a field by its first value, Elasticsearch's
// dynamic mapping, rejects the lines of another type). The end-to-end
// tests check the lines the daemons write (assertNoRepeatedKeys); this
// one also covers the lines no test provokes.
package logkeys
