// Package postfixinst prepares a private Postfix instance for the
// end-to-end tests and the benchmarks: its own configuration, queue and
// data directories under one directory, smtpd on a loopback address of its
// own, no daemon chrooted. The system's Postfix, if there is one, is never
// touched. Prepare writes main.cf and master.cf; the caller starts the
// instance (Command "start", or "start-fg" to keep its log) and stops it.
//
// Postfix's master runs as root and drops to the postfix user (Debian's
// postfix package creates it), so starting an instance needs root, and
// the postfix user must reach the queue: Prepare opens the directories on
// the way to it.
package postfixinst
