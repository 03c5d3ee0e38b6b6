package logkeys

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// jsonType is the JSON type zerolog writes for each typed field method;
// methods whose type depends on the value (Interface, RawJSON) are not
// judged.
var jsonType = map[string]string{
	"Str": "string", "Stringer": "string", "Time": "string", "Err": "string", "AnErr": "string", "IPAddr": "string", "Hex": "string",
	"Strs": "array", "Ints": "array", "Errs": "array", "Uints64": "array", "Floats64": "array", "Times": "array", "Durs": "array",
	"Int": "number", "Int64": "number", "Int32": "number", "Uint64": "number", "Uint32": "number", "Uint": "number",
	"Float64": "number", "Float32": "number", "Dur": "number", "TimeDiff": "number",
	"Bool": "bool", "Dict": "object", "Object": "object",
}

var fieldCall = regexp.MustCompile(`\.([A-Z][A-Za-z0-9]*)\("([a-z][a-z0-9_]*)",`)

// TestLogKeysHaveOneType: across the repository's code (tests and the
// benchmark tools aside), every log key is written with one JSON type.
// `rcpts` was a count on submission lines and a list on decision lines.
func TestLogKeysHaveOneType(t *testing.T) {
	root := "../.."
	seen := map[string]map[string]string{} // key → type → first place
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == "bench" || n == "testdata" || strings.HasPrefix(n, ".") && p != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		src := string(b)
		for _, m := range fieldCall.FindAllStringSubmatchIndex(src, -1) {
			method, key := src[m[2]:m[3]], src[m[4]:m[5]]
			typ, ok := jsonType[method]
			if !ok {
				continue
			}
			if seen[key] == nil {
				seen[key] = map[string]string{}
			}
			if _, ok := seen[key][typ]; !ok {
				rel, _ := filepath.Rel(root, p)
				seen[key][typ] = rel + ":" + strconv.Itoa(strings.Count(src[:m[0]], "\n")+1)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 50 {
		t.Fatalf("read %d log keys: the walk missed the code", len(seen))
	}
	for key, types := range seen {
		if len(types) > 1 {
			var at []string
			for typ, where := range types {
				at = append(at, typ+" at "+where)
			}
			sort.Strings(at)
			t.Errorf("log key %q has %d JSON types: %s", key, len(types), strings.Join(at, "; "))
		}
	}
}
