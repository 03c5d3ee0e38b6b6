package worker

import (
	"context"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// movesOn says whether a refusal is about the address rather than the
// destination's pace: a suspended pair, an open breaker or no free
// connection on one address sends the attempt to the next address. A
// "rate" refusal does not: it has given the envelope a place in that
// address's virtual queue, and the round-robin spreads the load anyway.
func movesOn(r throttle.Refusal) bool {
	switch r.Reason {
	case "suspended", "breaker-open", "breaker-half-open", "conns":
		return true
	}
	return false
}

// admitFrom asks the throttle for e. Without egress addresses it asks for
// the destination as a whole. With them, it tries the tenant's addresses
// from the next one in round-robin order and returns the first admitted
// with its permit; when every address refuses, the refusal that ends
// soonest (or the first "rate" refusal, which holds the envelope's place).
func (w *deliverer) admitFrom(ctx context.Context, e *queue.Envelope) (throttle.Permit, throttle.Refusal, *sender.Source) {
	if w.cfg.Egress.Len() == 0 {
		permit, r := w.cfg.Gate.Admit(ctx, e.Dest, e.Tenant, "")
		return permit, r, nil
	}
	return w.admitAmong(ctx, e, w.families.usable(e.Dest, w.cfg.Egress.Candidates(e.Tenant, e.Dest), w.now()))
}

// admitAmong asks the throttle for e from each of cands in turn and
// returns the first admitted with its permit, moving on past a refusal
// that concerns one address (movesOn); when every one refuses, the
// refusal that ends soonest, or at once one that holds the envelope's
// place.
func (w *deliverer) admitAmong(ctx context.Context, e *queue.Envelope, cands []sender.Source) (throttle.Permit, throttle.Refusal, *sender.Source) {
	var best throttle.Refusal
	for i := range cands {
		permit, r := w.cfg.Gate.Admit(ctx, e.Dest, e.Tenant, cands[i].String())
		if permit != nil {
			return permit, throttle.Refusal{}, &cands[i]
		}
		if !movesOn(r) {
			return nil, r, nil
		}
		if best.Until.IsZero() || r.Until.Before(best.Until) {
			best = r
		}
	}
	return nil, best, nil
}

// probeSource is the address an operator's probe goes out from: the next
// of the tenant's, or none without egress addresses.
func (w *deliverer) probeSource(e *queue.Envelope) *sender.Source {
	if w.cfg.Egress.Len() == 0 {
		return nil
	}
	return &w.families.usable(e.Dest, w.cfg.Egress.Candidates(e.Tenant, e.Dest), w.now())[0]
}

// otherFamily is called after an attempt from src that another family
// may do better: e's destination has no MX address of src's family
// (sender.Result.WrongFamily), or none of them connected while the MX
// hosts have addresses of the other family (sender.Result.Unreached). It
// returns a source of the other family among the tenant's addresses with
// its permit, admitted as admitFrom does (in round-robin order, moving on
// past a suspended pair, an open breaker or no free connection), without
// taking the destination's next turn (sender.Egress.FamilyCandidates).
// refused is set when the throttle refused every candidate; with
// neither, the tenant has no address of the other family. A probe takes
// its source without asking.
func (w *deliverer) otherFamily(ctx context.Context, e *queue.Envelope, src *sender.Source) (throttle.Permit, *sender.Source, *throttle.Refusal) {
	cands := w.cfg.Egress.FamilyCandidates(e.Tenant, e.Dest, !src.Addr.Is4())
	if len(cands) == 0 {
		return nil, nil, nil // nothing to try: the attempt's failure stands
	}
	if e.Probe {
		return probePermit{}, &cands[0], nil
	}
	permit, r, next := w.admitAmong(ctx, e, cands)
	if permit == nil {
		return nil, nil, &r
	}
	return permit, next, nil
}
