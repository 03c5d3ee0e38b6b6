package plot

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"time"
)

// Plot geometry, in SVG user units (pixels at 100%).
const (
	plotWidth   = 960
	plotLeft    = 96  // room for "attempt NN"
	plotRight   = 170 // room for "p50 … p95 …"
	plotTop     = 56  // title and policy line
	plotBottom  = 44  // axis labels
	plotRowH    = 28  // one strip per attempt
	plotBins    = 120 // histogram bins across the whole time axis
	plotMinSpan = 10  // ms; the axis never starts below 10 ms
)

// plotTicks are the axis labels, chosen because operators think in them.
var plotTicks = []time.Duration{
	10 * time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second,
	time.Minute, 10 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour,
	7 * 24 * time.Hour, 30 * 24 * time.Hour,
}

// Retries draws the spread of retry times per attempt: one strip per
// attempt, holding a histogram of the time since the first failure at which
// the attempt happens across all runs, with the 5th-95th percentile range
// as a whisker and the median as a red tick. The time axis is logarithmic
// because exponential backoff spaces attempts by a factor, not a constant;
// histogram bars, not one dot per run, keep the file small for any number of
// runs. at[a] holds attempt a+1's sorted times in ms since the first
// failure; heading is the first line (bold) and title the second.
func Retries(w io.Writer, heading, title string, at [][]int64) error {
	lo, hi := int64(math.MaxInt64), int64(plotMinSpan)
	for _, s := range at {
		if len(s) == 0 {
			continue
		}
		lo, hi = min(lo, s[0]), max(hi, s[len(s)-1])
	}
	lo = max(lo, plotMinSpan)
	x0 := math.Floor(math.Log10(float64(lo)))
	x1 := math.Ceil(math.Log10(float64(hi)))
	if x1 <= x0 {
		x1 = x0 + 1
	}
	innerW := float64(plotWidth - plotLeft - plotRight)
	xOf := func(ms int64) float64 {
		v := math.Log10(float64(max(ms, plotMinSpan)))
		return plotLeft + (min(max(v, x0), x1)-x0)/(x1-x0)*innerW
	}
	height := plotTop + len(at)*plotRowH + plotBottom
	axisY := plotTop + len(at)*plotRowH

	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		plotWidth, height, plotWidth, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="20" font-size="15" font-weight="bold">%s</text>`+"\n", plotLeft, html.EscapeString(heading))
	p(`<text x="%d" y="40" fill="#444">%s</text>`+"\n", plotLeft, html.EscapeString(title))

	// Grid and axis labels.
	for _, t := range plotTicks {
		ms := t.Milliseconds()
		v := math.Log10(float64(ms))
		if v < x0 || v > x1 {
			continue
		}
		x := xOf(ms)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, plotTop, x, axisY)
		p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#444">%s</text>`+"\n", x, axisY+16, tickLabel(t))
	}
	p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>`+"\n", plotLeft, axisY, plotWidth-plotRight, axisY)

	for a, s := range at {
		if len(s) == 0 {
			continue
		}
		top := plotTop + a*plotRowH
		base := float64(top + plotRowH - 4)
		p(`<text x="%d" y="%d" text-anchor="end">attempt %d</text>`+"\n", plotLeft-8, top+plotRowH/2+4, a+1)

		var bins [plotBins]int
		for _, ms := range s {
			i := int((xOf(ms) - plotLeft) / innerW * plotBins)
			bins[min(max(i, 0), plotBins-1)]++
		}
		peak := 0
		for _, c := range bins {
			peak = max(peak, c)
		}
		binW := innerW / plotBins
		for i, c := range bins {
			if c == 0 {
				continue
			}
			h := float64(c) / float64(peak) * float64(plotRowH-10)
			p(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4682b4" fill-opacity="0.75"><title>%d</title></rect>`+"\n",
				plotLeft+float64(i)*binW, base-h, binW, h, c)
		}
		p5, p50, p95 := Quantile(s, 0.05), Quantile(s, 0.5), Quantile(s, 0.95)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#222" stroke-width="1.5"/>`+"\n", xOf(p5), base+2, xOf(p95), base+2)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#c0392b" stroke-width="2"/>`+"\n", xOf(p50), top+4, xOf(p50), base+3)
		p(`<text x="%d" y="%d" fill="#444">p50 %s  p95 %s</text>`+"\n", plotWidth-plotRight+8, top+plotRowH/2+4, roundMs(p50), roundMs(p95))
	}
	p(`<text x="%d" y="%d" fill="#444">bars: how many runs make the attempt at that time; black: 5th-95th percentile; red: median</text>`+"\n", plotLeft, axisY+36)
	p("</svg>\n")
	return bw.Flush()
}

// tickLabel prints an axis tick compactly: 10ms, 1s, 10m, 6h, 7d.
func tickLabel(t time.Duration) string {
	switch {
	case t < time.Second:
		return fmt.Sprintf("%dms", t.Milliseconds())
	case t < time.Minute:
		return fmt.Sprintf("%ds", int(t.Seconds()))
	case t < time.Hour:
		return fmt.Sprintf("%dm", int(t.Minutes()))
	case t < 24*time.Hour:
		return fmt.Sprintf("%dh", int(t.Hours()))
	}
	return fmt.Sprintf("%dd", int(t.Hours()/24))
}

// roundMs formats ms as a duration rounded to three significant-ish units
// (1m2s rather than 1m2.345s) for labels.
func roundMs(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d >= time.Hour:
		d = d.Round(time.Minute)
	case d >= time.Minute:
		d = d.Round(time.Second)
	case d >= time.Second:
		d = d.Round(100 * time.Millisecond)
	}
	return d.String()
}

// Quantile returns the q-quantile of sorted (nearest rank).
func Quantile(sorted []int64, q float64) int64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
