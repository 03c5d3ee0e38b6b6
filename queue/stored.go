package queue

import "time"

// Stored is when the NATS server stored this delivery's message, by the
// server's clock: for fresh work the time of the submission's publish,
// for a lane's envelope the moment its schedule fired (or an operator
// fast-forwarded it). It is the one time on an envelope that no worker's
// clock wrote, so a worker can check its own clock against it. Zero when
// the server's metadata is unavailable.
func (d *Delivery) Stored() time.Time {
	if d == nil || d.msg == nil {
		return time.Time{}
	}
	md, err := d.msg.Metadata()
	if err != nil || md == nil {
		return time.Time{}
	}
	return md.Timestamp
}
