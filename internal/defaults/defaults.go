// Package defaults is in charge of the one rule outflow's configuration
// structs share for a numeric setting left out: zero (or a negative value,
// which no such setting accepts) means the package's Default constant.
// Settings where zero or a negative value means something else (off,
// unlimited) say so and are filled by hand.
package defaults

// Number is the kind of setting Set fills: counts, sizes, rates and
// durations (time.Duration is an int64).
type Number interface {
	~int | ~int64 | ~float64
}

// Set replaces *v with d when *v is zero or negative.
func Set[T Number](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
