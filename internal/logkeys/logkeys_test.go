package logkeys

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/outflow/outflow/internal/testutil"
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
	testutil.EachSource(t, root, []string{"bench", "testdata"}, func(rel, src string) {
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
				seen[key][typ] = rel + ":" + strconv.Itoa(strings.Count(src[:m[0]], "\n")+1)
			}
		}
	})
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
