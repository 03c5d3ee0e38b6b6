package jsonenc

import (
	"encoding/json"
	"math"
	"testing"
)

func TestAppendFloatMatchesMarshal(t *testing.T) {
	for _, f := range []float64{0, math.Copysign(0, -1), 1, -1.5, 2.5e-7, 1e-6, 9.99e20, 1e21, 1.2345678901234567e300,
		math.SmallestNonzeroFloat64, math.MaxFloat64, 3.0000000000000004, 1e-9} {
		want, _ := json.Marshal(f)
		if got, ok := AppendFloat(nil, f); !ok || string(got) != string(want) {
			t.Errorf("AppendFloat(%v) = %s, %v, want %s", f, got, ok, want)
		}
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if _, ok := AppendFloat(nil, f); ok {
			t.Errorf("AppendFloat(%v) accepted", f)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	f.Add("<a@b> & \"x\" \\ \x00\n\u2028\xff ü")
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := AppendString(nil, s); string(got) != string(want) {
			t.Fatalf("AppendString(%q) = %s, want %s", s, got, want)
		}
	})
}
