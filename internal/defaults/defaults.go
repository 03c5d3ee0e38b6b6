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
