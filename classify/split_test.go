package classify

import (
	"hash/fnv"
	"sort"
	"strings"
	"testing"
)

// corpusFiles are the replies the tests and the model's training read: the
// shared rows first, then the rows gathered from published references.
var corpusFiles = []string{"testdata/smtp-replies.tsv", "testdata/provider-replies.tsv"}

// providerGroup is the unit of the validation split: the provider's first
// word, lower-cased, without its parenthesised detail ("Microsoft (Exchange
// Online)" and "Microsoft (Outlook.com/Hotmail)" are both "microsoft").
func providerGroup(p string) string {
	p = strings.ToLower(p)
	if i := strings.IndexByte(p, '('); i >= 0 {
		p = p[:i]
	}
	f := strings.Fields(p)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// split divides the corpus by provider, never by row. The held-out groups
// are providers the shared rows (which the rules were first written
// against) do not have, taken in the order of a hash of their name until
// they hold a quarter of all rows: a choice no one made by looking at the
// rows. No rule or model weight was written from a held-out row.
func split(t testing.TB) (train, heldOut []replyRow) {
	t.Helper()
	var all []replyRow
	shared := map[string]bool{}
	for i, f := range corpusFiles {
		rows := readReplies(t, f)
		if i == 0 {
			for _, r := range rows {
				shared[providerGroup(r.provider)] = true
			}
		}
		all = append(all, rows...)
	}
	count := map[string]int{}
	for _, r := range all {
		count[providerGroup(r.provider)]++
	}
	var eligible []string
	for g := range count {
		if !shared[g] {
			eligible = append(eligible, g)
		}
	}
	h := func(g string) uint32 {
		x := fnv.New32a()
		x.Write([]byte("holdout:" + g))
		return x.Sum32()
	}
	sort.Slice(eligible, func(i, j int) bool { return h(eligible[i]) < h(eligible[j]) })
	out := map[string]bool{}
	n := 0
	for _, g := range eligible {
		if 4*n >= len(all) {
			break
		}
		out[g] = true
		n += count[g]
	}
	for _, r := range all {
		if out[providerGroup(r.provider)] {
			heldOut = append(heldOut, r)
		} else {
			train = append(train, r)
		}
	}
	return train, heldOut
}

// agreement classifies rows as log lines (stage unknown) and returns the
// share that get their expected class, and the rows where a reply that
// should be retried (transient or throttled) was called permanent.
func agreement(c *Classifier, rows []replyRow) (float64, []replyRow, []replyRow) {
	var misses, unsafe []replyRow
	for _, r := range rows {
		got := c.Classify(Input{Raw: r.text}).Class
		if got != r.class {
			misses = append(misses, r)
			if got == Permanent && (r.class == Transient || r.class == Throttled) {
				unsafe = append(unsafe, r)
			}
		}
	}
	return 1 - float64(len(misses))/float64(len(rows)), misses, unsafe
}

// validationFloor is the agreement the held-out providers must reach. The
// figure measured when the split was made is in docs/classification.md.
const validationFloor = 0.95

// TestValidationSplit is the generalization check: the classifier must agree
// with replies from providers it was never written against, and must never
// call a retryable one permanent (that bounces mail a retry would deliver).
func TestValidationSplit(t *testing.T) {
	train, held := split(t)
	if len(held)*100 < (len(train)+len(held))*24 {
		t.Fatalf("held out %d of %d rows, want a quarter", len(held), len(train)+len(held))
	}
	// The misses are deliberately not listed: reading them would turn the
	// next rule into one written against the held-out rows.
	got, _, unsafe := agreement(Default(), held)
	t.Logf("held out: %d rows, agreement %.1f%%, %d retryable called permanent", len(held), 100*got, len(unsafe))
	if got < validationFloor {
		t.Errorf("held-out agreement %.1f%%, want at least %.0f%%", 100*got, 100*validationFloor)
	}
	for _, r := range unsafe {
		t.Errorf("retryable reply called permanent (%s, want %s): %s", r.provider, r.class, r.text)
	}
}

// TestTrainingSplit reports agreement on the rows the rules and the model
// were written from; a drop here is a regression, not a generalization
// question.
func TestTrainingSplit(t *testing.T) {
	train, _ := split(t)
	got, misses, unsafe := agreement(Default(), train)
	t.Logf("training: %d rows, agreement %.1f%%", len(train), 100*got)
	for _, r := range misses {
		t.Errorf("line %d (%s): got other than %s: %s", r.line, r.provider, r.class, r.text)
	}
	for _, r := range unsafe {
		t.Errorf("retryable reply called permanent (%s): %s", r.provider, r.text)
	}
}
