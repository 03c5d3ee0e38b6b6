// Package testpki is in charge of throw-away certificate authorities and
// server certificates for tests: a root, optionally an intermediate, and
// leaf certificates for given host names, all ECDSA P-256, valid from an
// hour ago for a day unless the test asks otherwise.
package testpki
