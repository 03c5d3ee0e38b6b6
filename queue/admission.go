package queue

import "context"

// Admission is the delivery side's say in the hand-off: whether a delivery
// of a tenant's may start now. The worker pool keeps each tenant to its
// share of the delivery slots (worker's tenantSlots): a tenant whose mail
// goes to hosts that hold every session for minutes would otherwise fill
// every slot, and every other tenant's mail would wait those minutes for
// one to come free, whatever order the hand-off gave it.
//
// fetchOnce asks it on the work lane, whose consumers are one tenant's
// each: an envelope that is not admitted waits in the process, as one no
// worker is free for does (given back after half the ack wait), until
// Changed says the answer may have changed, and the other tenants' pulls
// go on. The retry and rate-limit lanes, shared by every tenant, do not
// ask (fetchOnce): the worker sends an envelope of a tenant at its share
// back to its lane for later.
type Admission interface {
	// Admits reports whether a delivery of tenant's may start now.
	Admits(tenant string) bool
	// Started counts a delivery of tenant's handed to a slot. The hand-off
	// counts it, as the slot takes it and before it asks again, so that a
	// pull handing out envelopes one after another cannot overshoot; the
	// slot says when it ends.
	Started(tenant string)
	// Changed returns a channel closed at the next change that may turn
	// an Admits from false to true (a delivery that ended).
	Changed() <-chan struct{}
}

type admissionKey struct{}

// WithAdmission returns ctx carrying a, for Messages: the pulls it starts
// hand out only what a admits.
func WithAdmission(ctx context.Context, a Admission) context.Context {
	return context.WithValue(ctx, admissionKey{}, a)
}

// admissionOf is the Admission ctx carries, or nil (every envelope may be
// handed out).
func admissionOf(ctx context.Context) Admission {
	a, _ := ctx.Value(admissionKey{}).(Admission)
	return a
}

// started tells a, if any, that d was handed to a slot.
func started(a Admission, d *Delivery) {
	if a != nil {
		a.Started(d.Env.Tenant)
	}
}

// nextAdmitted is the index in waiting of the oldest envelope a admits,
// or -1 (0 for a non-empty waiting without an Admission). A run of one
// tenant's envelopes is asked about once: a tenant's work lane is all its
// own.
func nextAdmitted(a Admission, waiting []*Delivery) int {
	if a == nil {
		if len(waiting) > 0 {
			return 0
		}
		return -1
	}
	refused, asked := "", false
	for i, d := range waiting {
		t := d.Env.Tenant
		if asked && t == refused {
			continue
		}
		if a.Admits(t) {
			return i
		}
		refused, asked = t, true
	}
	return -1
}
