package defaults

import (
	"testing"
	"time"
)

func TestSet(t *testing.T) {
	for _, c := range []struct{ v, want time.Duration }{{0, time.Second}, {-1, time.Second}, {time.Minute, time.Minute}} {
		got := c.v
		Set(&got, time.Second)
		if got != c.want {
			t.Errorf("Set(%v, 1s) = %v, want %v", c.v, got, c.want)
		}
	}
	n, f := 0, 0.5
	Set(&n, 32)
	Set(&f, 0.1)
	if n != 32 || f != 0.5 {
		t.Errorf("int %d (want 32), float %v (want the set 0.5)", n, f)
	}
}
