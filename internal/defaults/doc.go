// Package defaults is in charge of the one rule outflow's configuration
// structs share for a numeric setting left out: zero (or a negative value,
// which no such setting accepts) means the package's Default constant.
// Settings where zero or a negative value means something else (off,
// unlimited) say so and are filled by hand.
package defaults
