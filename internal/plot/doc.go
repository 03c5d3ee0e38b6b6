// Package plot is in charge of drawing outflow's retry timelines as SVG: one
// strip per attempt on a logarithmic time axis since the first failure. Both
// `outflow schedule --plot` (the spread of many simulated runs) and the
// operator's console (one message's actual attempts) draw with Retries, so
// the two pictures read the same way.
package plot
