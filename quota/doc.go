// Package quota is in charge of tenants' sending limits: at most so many
// recipients per rolling 24 hours for a tenant, counted across the fleet,
// as a mail system's operator sets them so that one tenant's leaked
// password cannot spend the sending addresses' reputation on a spam run
// (Postal's send limit, mox's MaxOutgoingMessagesPerDay).
//
// The count lives in the outflow_quota bucket, one key per tenant and hour,
// leased by each process in growing steps and given back when unused
// (Limiter). A limit counts the current hour and the 24 whole hours before
// it, so that no 24 hours, wherever they start, hold more than the limit:
// what is taken in an hour comes free 24 hours after that hour ends
// (recipients taken at 10:00:00 and at 10:59:59 both come free at 11:00:00
// the next day). A lease is a compare-and-set of its hour's key; since a
// process whose clock has passed the hour writes the next hour's key, a
// lease reads the hours beside its own again after its write and takes
// itself back if together they went over the limit. The submission
// listener takes one recipient at each RCPT and
// the HTTP API a message's recipients at once, before they are stored, and
// both give back what they took for a message not stored in the end (not
// for one that may be stored in part, queue.ErrMaybeStored: what is
// stored is delivered); past
// the limit the listener answers 452 4.4.5 and the API 429, both saying
// when part of the limit comes free. A limit is checked or the recipient
// refused: when the bucket cannot be read, the answer is a temporary
// failure, as for the suppression list. Read gives the counts for
// `outflow quota list`.
package quota
