package main

import (
	"fmt"
	"strings"
)

// scenario5 measures what durability costs: scenario 1 through outflow
// with --durability disk (the default: group-committed fsyncs before every
// 250) and none (the server's acknowledgement alone), and through Postfix
// (which fsyncs each queue file before its 250), alternating; then one
// straced run of each to count every fsync-family call.
func (s *suite) scenario5() error {
	n := s.e2eMsgs()
	counted := 2000
	if s.c.quick {
		counted = 1000
	}
	systems := []system{
		s.outflowSystem("outflow disk"),
		s.outflowSystem("outflow none", "--durability", "none"),
		postfixSystem(nil),
	}
	t := &table{
		title: "Scenario 5: durability cost (`--durability disk`, the default, against `none` and Postfix)",
		notes: []string{fmt.Sprintf("Scenario 1's load (`smtp-source -s 20 -m %d -l SIZE`, to smtp-sink) through outflow with `--durability disk` (the default: every 250 after a group-committed fsync), outflow with `--durability none` (250 once the server has the write in memory) and Postfix (fsyncs each queue file before its 250). The three alternate, the order rotating each run; msg/s and the relay's CPU per message (the machine's busy time less the load tools and the harness, as in scenario 1) are medians of %d runs. "+
			"fsyncs/msg, own count: the increase of `outflow_store_fsyncs_total` over the timed run (outflow's group commit only; none has no group commit to count). fsyncs/msg, strace: one more, untimed run of %d messages per system with `strace -f -c -e trace=fsync,fdatasync` attached to its processes (outflow's one, Postfix's master and its children), which counts every fsync and fdatasync, the server's and Postfix's own included; strace slows what it traces, so this run's rate is not reported.", n, s.c.runs, counted)},
		head: []string{"size", "system", "msg/s (runs)", "/ disk", "relay µs/msg", "fsyncs/msg, own count", "fsyncs/msg, strace"},
	}
	var failed []string
	for _, size := range []int{2048, 100 << 10} {
		fmt.Printf("scenario 5: %d messages of %d bytes\n", n, size)
		runs, err := s.compareAll(systems, n, size)
		if err != nil {
			return err
		}
		disk := median(rates(runs[0]))
		for i, sys := range systems {
			traced := "–"
			fmt.Printf("  %s: counting fsyncs of %d messages with strace\n", sys.name, counted)
			if f, err := fsyncCount(sys, counted, size); err != nil {
				failed = append(failed, err.Error())
				fmt.Printf("  %s: %v\n", sys.name, err)
			} else {
				traced = fmt.Sprintf("%.2f", f)
				fmt.Printf("  %s: %.2f fsyncs per message\n", sys.name, f)
			}
			r := runs[i]
			t.rows = append(t.rows, []string{sizeName(size), sys.name,
				fmt.Sprintf("**%.0f** (%s)", median(rates(r)), fmtRuns(rates(r), "")),
				fmt.Sprintf("%.2f", median(rates(r))/disk),
				fmt.Sprintf("%.0f", medianOf(r, func(r e2eRun) float64 { return r.perMsg(r.cpu.relay()) })),
				medianFsyncs(r), traced})
		}
	}
	if len(failed) > 0 {
		t.notes = append(t.notes, "", "strace counts missing: "+strings.Join(failed, "; "))
	}
	s.tables = append(s.tables, t)
	return nil
}
