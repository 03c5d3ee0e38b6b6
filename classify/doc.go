// Package classify is in charge of deciding what every SMTP reply and
// transport event means for a message: delivered, transient, throttled,
// permanent or unknown, how far that applies (recipient, message, tenant,
// destination, connection or source), which rule said so, and any retry hint the
// server gave. It decides every retry, so it is written against the replies
// real mailbox providers send, not only against the first digit.
//
// Rules are data: two embedded TOML files (rules/providers.toml, then
// rules/generic.toml), optionally preceded by an operator's file, tried in
// order with the first match winning. Provider rules know what Gmail,
// Yahoo, Microsoft and others mean by their words (a 550 that means slow
// down, a 421 that will never succeed) and, for providers that publish a
// table of reply codes (Cox, Spectrum, NetEase, GoDaddy), by their codes:
// tags, matched as whole tokens, with number ranges (AUP#I-{1300-1340}).
// Generic rules go by text signals, then the enhanced status code (RFC
// 3463; a pattern may give a range, 4.7.500-699), then the basic code
// (RFC 5321), then transport events. The text signals name meanings, not
// wordings: besides phrases they have near phrases ("exceed ~4 limit":
// "exceed", then "limit" within four words), a second phrase condition
// (also_text: "over quota" is a full mailbox only beside a word of the
// mailbox) and not_text guards, so a new wording of a meaning matches and
// another meaning that shares a word ("too many recipients" in one message,
// "limit" of a size) does not. Weighted words are the last layer, for the
// rules that go by the code alone. docs/classification.md documents the
// classes, the rules and the file format.
//
// Failure semantics in one paragraph: a 2xx is delivered; 4xx is transient
// unless its text asks to slow down (throttled) or says it will never
// succeed (permanent); 5xx is permanent unless its text asks to slow down;
// an unreadable reply is transient (an unknown error must not bounce
// mail); only the absence of a reply to the final dot is unknown (RFC 5321
// 6.1: the message may have been delivered).
//
// Classification is a pure function: New compiles the rules once (all
// phrases of all rules, near phrases' parts and tags' literal starts into
// one Aho-Corasick automaton, and bit sets of the rules each basic code,
// stage, enhanced code (or group of codes a range covers) and phrase
// allows), and Classify then scans the text once, intersects the sets,
// tests only the candidates left (a near phrase's word distances, a tag's
// token bounds, a regexp), does no I/O, keeps no state and, for a
// single-line reply, does not allocate. The result is the one trying every rule in
// order would give; a test and the fuzz target check that it is.
package classify
