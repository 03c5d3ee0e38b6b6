package worker

import (
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
)

// prefixReturnPath stands in for *bounce.ReturnPath: tenant t1's mail
// goes out with a return path naming the envelope, a null sender stays
// null.
type prefixReturnPath struct{}

func (prefixReturnPath) Address(tenant, id, from string, _ time.Time) string {
	if tenant != "t1" || from == "" {
		return from
	}
	return "b." + id + "@rp.test"
}

// With a return path the attempt's MAIL FROM is the tenant's return-path
// address for that envelope; the message itself is unchanged.
func TestReturnPathIsTheEnvelopeSender(t *testing.T) {
	e := newEnv(t, nil)
	e.startPool(func(c *Config) { c.ReturnPath = prefixReturnPath{} })
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDelivered)
	msgs := e.mx.Messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages at the MX", len(msgs))
	}
	if msgs[0].From != "b."+id+"@rp.test" {
		t.Fatalf("MAIL FROM %q, want the envelope's return path", msgs[0].From)
	}
}
