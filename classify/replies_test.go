package classify

import (
	"encoding/csv"
	"os"
	"strconv"
	"testing"
)

// replyRow is one row of testdata/smtp-replies.tsv: a real reply from a
// mailbox provider with its published source and the class it should get.
type replyRow struct {
	line     int
	provider string
	code     int
	enhanced string
	text     string
	class    Class
	source   string
	verified bool // found at source; set by split, not by readReplies
}

// readReplies reads a copy of ../shared/testdata/smtp-replies.tsv kept in
// testdata so the package tests alone. Fields are tab separated; a field
// holding quotes is quoted CSV style ("4.7.1 Ratelimit ""user"" ...").
func readReplies(t testing.TB, path string) []replyRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comma = '\t'
	r.Comment = '#'
	recs, err := r.ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var rows []replyRow
	for i, rec := range recs[1:] {
		if len(rec) != 6 {
			t.Fatalf("%s: row %d has %d fields, want 6", path, i+2, len(rec))
		}
		row := replyRow{line: i + 2, provider: rec[0], enhanced: rec[2], text: rec[3], source: rec[5]}
		if rec[1] != "" {
			if row.code, err = strconv.Atoi(rec[1]); err != nil {
				t.Fatalf("%s: row %d: code %q: %v", path, i+2, rec[1], err)
			}
		}
		if row.class, err = ParseClass(rec[4]); err != nil {
			t.Fatalf("%s: row %d: %v", path, i+2, err)
		}
		rows = append(rows, row)
	}
	return rows
}

// TestReplies classifies every real reply in the corpus, as the raw line a
// log would show, at an unknown stage and again as the reply to the final
// dot, and checks the class and the parsed codes.
func TestReplies(t *testing.T) {
	c := Default()
	rows := readReplies(t, "testdata/smtp-replies.tsv")
	if len(rows) < 100 {
		t.Fatalf("read %d rows, want the whole corpus", len(rows))
	}
	for _, row := range rows {
		t.Run(strconv.Itoa(row.line)+"-"+row.provider, func(t *testing.T) {
			in := Parse(row.text)
			if in.Code != row.code || in.Enhanced != row.enhanced {
				t.Errorf("Parse: code %d enhanced %q, want %d %q", in.Code, in.Enhanced, row.code, row.enhanced)
			}
			for _, st := range []Stage{StageUnknown, StageDataEnd} {
				res := c.Classify(Input{Raw: row.text, Stage: st})
				if res.Class != row.class {
					t.Errorf("stage %s: class %s (rule %s, scope %s), want %s\n%s", st, res.Class, res.Rule, res.Scope, row.class, row.text)
				}
			}
		})
	}
}
