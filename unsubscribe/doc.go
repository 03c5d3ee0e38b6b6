// Package unsubscribe is in charge of one-click unsubscribe (RFC 8058,
// with RFC 2369's List-Unsubscribe): the link outflow puts in a bulk
// message for each recipient, and the page behind it.
//
// A message gets, per recipient, the two fields
//
//	List-Unsubscribe: <https://mail.example.com/unsubscribe/TOKEN>
//	List-Unsubscribe-Post: List-Unsubscribe=One-Click
//
// (Links.Header; Has tells whether the message has its own already). The
// token names the tenant, the recipient and the envelope that carried the
// link, sealed with XChaCha20-Poly1305 under a key for the whole fleet
// (LoadKey, in the outflow_unsubscribe bucket), so that any process can
// open a link any worker wrote. Sealed rather than signed: a URL ends up
// in proxy and browser logs and in link scanners' reports, and the
// recipient's address is not to be read there. Its nonce is derived from
// what it seals, so the same recipient of the same envelope always gets
// the same token: every retry of a message sends the same bytes, and a
// DKIM signature made once over the fields stays valid. Nobody without
// the key can make a token, or change one into another that opens.
//
// NewHandler serves the links. A GET never unsubscribes: mail providers'
// and companies' link scanners fetch every URL of a message before anyone
// reads it, and a GET that unsubscribed would take recipients off lists
// they never left. A GET (a person who clicked the link in a client that
// does not offer one-click) shows a page with a button, which POSTs what
// a provider's one-click POST carries (List-Unsubscribe=One-Click, without
// cookies or credentials, none of which the handler asks for). A POST puts
// the recipient on its tenant's suppression list (source "unsubscribe")
// and records an `unsubscribed` event of the envelope, async like a later
// bounce; an address a hard bounce or a complaint already keeps off the
// list's mail keeps that entry and gets the event. Both are on disk before
// the answer says so. If any store fails the answer is 503 with
// Retry-After: nothing was promised, and the provider, or the person
// pressing the button again, tries again. An address already unsubscribed
// is answered as done without a second event, since a provider may POST
// twice. A token that does not open is a 404 that says no more than that.
//
// The handler is mounted on the API listener at /unsubscribe/. That path
// is the only one of the listener to be exposed publicly (a reverse proxy
// that forwards /unsubscribe/ and nothing else): the rest of the API is
// for tenants' applications and operators.
package unsubscribe
