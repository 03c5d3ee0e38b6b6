package classify

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// replyRow is one row of a corpus file (testdata/smtp-replies.tsv and the
// others): a real reply from a mailbox provider with its published source
// and the class and scope it should get.
type replyRow struct {
	file     string
	line     int
	provider string
	code     int
	enhanced string
	text     string
	class    Class
	scope    Scope // 0 when the row says none
	stage    Stage // the stage the source shows the reply at; StageUnknown when the row says none
	source   string
	verified bool // found at source; set by split, not by readReplies
}

// smtpRepliesScopes holds the expected scopes of smtp-replies.tsv, which is
// a copy of the shared corpus and keeps its six columns.
const smtpRepliesScopes = "testdata/smtp-replies-scopes.tsv"

// readReplies reads a corpus file: a copy of
// ../shared/testdata/smtp-replies.tsv kept in testdata so the package tests
// alone, or one of the package's own files. Fields are tab separated; a
// field holding quotes is quoted CSV style ("4.7.1 Ratelimit ""user"" ...").
// The six columns of the shared file are provider, code, enhanced_code,
// full_text, expected_class and source_url; the package's files add a
// seventh, expected_scope, and the scopes of smtp-replies.tsv are in
// smtp-replies-scopes.tsv (by row, with the text to check the row is the
// same). The unseen files add an eighth, stage: the row is classified at
// that stage, and its expected scope is the scope there.
func readReplies(t testing.TB, path string) []replyRow {
	t.Helper()
	recs := readTSV(t, path)
	var rows []replyRow
	for i, rec := range recs[1:] {
		if len(rec) < 6 || len(rec) > len(recs[0]) || len(rec) == 8 && recs[0][7] != "stage" {
			t.Fatalf("%s: row %d has %d fields, want 6 or 7, or 8 under a stage column", path, i+2, len(rec))
		}
		row := replyRow{file: filepath.Base(path), line: i + 2, provider: rec[0], enhanced: rec[2], text: rec[3], source: rec[5]}
		var err error
		if rec[1] != "" {
			if row.code, err = strconv.Atoi(rec[1]); err != nil {
				t.Fatalf("%s: row %d: code %q: %v", path, i+2, rec[1], err)
			}
		}
		if row.class, err = ParseClass(rec[4]); err != nil {
			t.Fatalf("%s: row %d: %v", path, i+2, err)
		}
		if len(rec) >= 7 {
			if row.scope, err = ParseScope(rec[6]); err != nil {
				t.Fatalf("%s: row %d: %v", path, i+2, err)
			}
		}
		if len(rec) == 8 && rec[7] != "" {
			if row.stage, err = ParseStage(rec[7]); err != nil {
				t.Fatalf("%s: row %d: %v", path, i+2, err)
			}
		}
		rows = append(rows, row)
	}
	if filepath.Base(path) == "smtp-replies.tsv" {
		addScopes(t, rows, filepath.Join(filepath.Dir(path), filepath.Base(smtpRepliesScopes)))
	}
	return rows
}

func readTSV(t testing.TB, path string) [][]string {
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
	if len(recs) == 0 {
		t.Fatalf("%s: empty", path)
	}
	return recs
}

// addScopes sets the scopes of smtp-replies.tsv's rows from path, whose
// columns are row (as readReplies numbers it), expected_scope and full_text.
// Every row must have one, and the text must be the row's.
func addScopes(t testing.TB, rows []replyRow, path string) {
	t.Helper()
	byLine := map[int]int{}
	for i, r := range rows {
		byLine[r.line] = i
	}
	recs := readTSV(t, path)
	for _, rec := range recs[1:] {
		if len(rec) != 3 {
			t.Fatalf("%s: %d fields, want 3: %q", path, len(rec), rec)
		}
		line, err := strconv.Atoi(rec[0])
		if err != nil {
			t.Fatalf("%s: row %q: %v", path, rec[0], err)
		}
		i, ok := byLine[line]
		if !ok || rows[i].text != rec[2] {
			t.Fatalf("%s: row %d: the text is not smtp-replies.tsv's row %d: %q", path, line, line, rec[2])
		}
		if rows[i].scope != 0 {
			t.Fatalf("%s: row %d twice", path, line)
		}
		if rows[i].scope, err = ParseScope(rec[1]); err != nil {
			t.Fatalf("%s: row %d: %v", path, line, err)
		}
	}
	for _, r := range rows {
		if r.scope == 0 {
			t.Fatalf("%s: no scope for smtp-replies.tsv row %d: %s", path, r.line, r.text)
		}
	}
}

// scopeMisses returns the rows, of those with their expected class, whose
// scope is not the expected one when classified as log lines (stage
// unknown, or the row's stage), with the scope they got; a row that names
// no scope fails.
func scopeMisses(c *Classifier, rows []replyRow) (misses []string) {
	for _, r := range rows {
		res := c.Classify(Input{Raw: r.text, Stage: r.stage})
		if res.Class == r.class && res.Scope != r.scope {
			misses = append(misses, fmt.Sprintf("%s row %d (%s, stage %s): scope %s (rule %s), want %s: %s", r.file, r.line, r.provider, r.stage, res.Scope, res.Rule, r.scope, r.text))
		}
	}
	return misses
}

// TestReplies classifies every real reply in the corpus, as the raw line a
// log would show, at an unknown stage and again as the reply to the final
// dot, and checks the class, the scope and the parsed codes.
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
				if res.Scope != row.scope {
					t.Errorf("stage %s: scope %s (rule %s, class %s), want %s\n%s", st, res.Scope, res.Rule, res.Class, row.scope, row.text)
				}
			}
		})
	}
}
