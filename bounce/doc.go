// Package bounce is in charge of the mail that comes back after a
// destination said 250: asynchronous bounces (RFC 3464 delivery status
// notifications that a receiving system mails later, when the mailbox
// behind an accepting MX turns out not to exist or to be full) and spam
// complaints (RFC 5965 feedback reports). Without it they go to the
// envelope sender the application gave, and outflow never learns of them:
// its events say "delivered", and its suppression list keeps mailing the
// address.
//
// Two halves:
//
//   - ReturnPath (returnpath.go) makes the envelope sender a worker puts in
//     MAIL FROM when the tenant has a return-path domain:
//     b.<envelope id>.<minute>.<mac>@<domain>, the MAC keyed with one key
//     for the fleet (LoadKey, in the outflow_bounces bucket). The domain's
//     MX points at the listener; its SPF record must allow the addresses
//     outflow sends from, since receivers check SPF on this domain now.
//     serve splits such a tenant's submissions per recipient
//     (queue.Submission.PerRecipient), as `outflow submit` does whenever
//     the fleet has made the key (InUse), and a worker gives a return
//     path only to an envelope of one recipient, sending one of several
//     with its own sender (worker/deliver.go): a return path names one
//     recipient's envelope, and a report to it can only be about that
//     recipient.
//   - Server (server.go) is that listener: SMTP without AUTH that takes
//     RCPT for this fleet's return-path addresses only (550 5.1.1 for any
//     other), reads the message as a DSN or a feedback report (package dsn)
//     and records it before its 250 (record.go): each failed recipient
//     becomes a `bounced` event marked async on the envelope it came back
//     for, suppressed when its diagnostic classifies as a permanent refusal
//     of the recipient (the rule a bounce during delivery follows); an
//     abuse report becomes a `complained` event and a suppression. The
//     envelope's tenant, destination and delivered recipients come from its
//     events, so a report can name only a recipient the envelope was
//     delivered to. A report that cannot be recorded now is answered 451.
//     Reports about envelopes whose events have expired are taken and
//     counted, not recorded; free-text bounces, auto-replies and reports
//     that cannot be read are refused (550 5.6.0), so that a 250 always
//     means a report was read. It also takes fbl@ each return-path domain,
//     the address registered with providers' feedback loops, where a report
//     names its envelope by the return path it was sent from: its
//     Original-Mail-From, else the original's Return-Path, else another of
//     the original's fields (Authentication-Results' smtp.mailfrom=,
//     Received-SPF's envelope-from=), whichever comes first with a MAC that
//     verifies (record.go, withOriginal). There alone, a message that is no
//     report but attaches the original (message/rfc822) naming such a
//     return path, Microsoft JMRP's older format, is an abuse complaint by
//     the original's X-HmXmrOriginalRecipient (record.go, attached). With
//     Config.Postmaster it takes postmaster@ and abuse@ each return-path
//     domain: those are forwarded to the operator through the queue, from
//     the null sender, stored before the 250 (server.go, forward).
//
// A tenant whose mail carries a return path no longer receives the remote
// systems' bounces itself: its application learns of them from events and
// webhooks, as with a hosted sending service, and, where its mail gets
// notices, from the notices (failure, delay, success, as NOTIFY asked)
// outflow writes in their place (Config.Notifier, worker.Pool.ReportedLater;
// what they need is on the delivered event, queue.Event.Notify), queued
// before the 250.
package bounce
