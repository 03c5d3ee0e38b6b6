package throttle

import (
	"testing"
	"time"
)

// TestOverShareKeepsTheNextToken: a tenant with a backlog in the virtual
// queue does not yield a token due within yieldLead (1 s; one period
// before) to a tenant that only asked lately and has nothing waiting:
// nothing of the other's can take it, and it went untaken
// (TestTenantWeightsShareABusyDestination, "with a trickle";
// TestTrickleKeepsALearnedRateBusy). A token further ahead it still
// yields, so that the other's next message does not wait behind the
// backlog's reservations; and to a tenant with envelopes waiting it
// yields as before. At either weight of the backlog's tenant.
func TestOverShareKeepsTheNextToken(t *testing.T) {
	weights := map[string]float64{"heavy": 3}
	weight := func(tn string) float64 {
		if w, ok := weights[tn]; ok {
			return w
		}
		return 1
	}
	for _, tenant := range []string{"heavy", "light"} {
		t.Run(tenant, func(t *testing.T) {
			d := &dest{}
			d.bucket.setRate(t0, 20)
			d.seen(tenant, t0)
			for range 100 {
				d.slot(tenant, t0, t0, 20, weight, 0) // 5 s ahead at its share
			}
			d.seen("resets", t0) // asked, admitted: nothing waiting
			now := t0.Add(20 * time.Millisecond)
			d.bucket.reserve(t0)
			if due := d.bucket.reserve(now); due.Sub(now) != 30*time.Millisecond {
				t.Fatalf("token due %s ahead, want 30ms", due.Sub(now))
			}
			if d.overShare(tenant, now, weight) {
				t.Error("yields the token due in 30 ms to a tenant with nothing waiting")
			}
			for range 10 { // 530 ms ahead: still kept
				d.bucket.reserve(now)
			}
			if d.overShare(tenant, now, weight) {
				t.Errorf("yields a token due %s ahead to a tenant with nothing waiting", d.bucket.last.Sub(now))
			}
			for range 10 { // 1.03 s ahead
				d.bucket.reserve(now)
			}
			if !d.overShare(tenant, now, weight) {
				t.Errorf("keeps a token due %s ahead while another tenant sends", d.bucket.last.Sub(now))
			}
			d.bucket = bucket{}
			d.bucket.setRate(now, 20)
			d.bucket.reserve(t0)
			d.bucket.reserve(now)
			d.slot("resets", now, now, 20, weight, 0) // one envelope waiting for its place
			if !d.overShare(tenant, now, weight) {
				t.Error("keeps the next token from a tenant with an envelope waiting")
			}
		})
	}
}
