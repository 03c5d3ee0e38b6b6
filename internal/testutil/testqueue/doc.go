// Package testqueue is in charge of connecting a test to an embedded
// queue in process, as the daemon does. It is apart from testutil, which
// the queue's own tests import.
package testqueue
