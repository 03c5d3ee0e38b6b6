package console

import (
	"bytes"
	"fmt"
	"html/template"
)

// Chart geometry, in SVG user units.
const (
	chartW     = 300
	chartH     = 90
	chartPad   = 4
	chartLabel = 16 // room at the bottom for the axis labels
)

// chartColors match the badges of each type in the stylesheet.
var chartColors = map[string]string{"delivered": "#2e7d32", "deferred": "#ef6c00", "throttled": "#c62828", "bounced": "#6a1b9a"}

// minuteChart draws counts of recipients (one per minute, oldest first;
// typ their outcome) as a small bar
// chart: drawn here, as SVG, so the page needs no script and no library.
// The text is only numbers and fixed words; nothing from a message or a
// peer is drawn.
func minuteChart(typ string, counts []int) template.HTML {
	peak, total := 0, 0
	for _, n := range counts {
		peak = max(peak, n)
		total += n
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" role="img" aria-label="recipients %s per minute, last hour">`, chartW, chartH, typ)
	fmt.Fprintf(&b, `<title>recipients %s per minute over the last hour: %d in all, at most %d in a minute</title>`, typ, total, peak)
	innerH := float64(chartH - chartLabel - chartPad)
	bw := float64(chartW-2*chartPad) / float64(len(counts))
	base := float64(chartH - chartLabel)
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#999"/>`, chartPad, base, chartW-chartPad, base)
	for i, n := range counts {
		if n == 0 || peak == 0 {
			continue
		}
		h := max(float64(n)/float64(peak)*innerH, 1)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d</title></rect>`,
			chartPad+float64(i)*bw+0.5, base-h, max(bw-1, 1), h, chartColors[typ], n)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#555">-60m</text>`, chartPad, chartH-3)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#555" text-anchor="end">now</text>`, chartW-chartPad, chartH-3)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#555" text-anchor="middle">peak %d/min</text>`, chartW/2, chartH-3, peak)
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers and constants above
}
