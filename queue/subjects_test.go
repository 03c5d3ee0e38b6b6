package queue

import (
	"strings"
	"testing"
)

// TestSubjectLayout pins the builders to the layout in subjects.go's
// comment: stored envelopes and running daemons depend on these strings.
func TestSubjectLayout(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{workSubject("t.1", "d.example", "ID"), "outflow.work.t_1.d_example.ID"},
		{schedSubject(LaneRetry, "d.example", "ID"), "outflow.retry.sched.d_example.ID"},
		{dueSubject(LaneRateLimit, "d.example", "ID"), "outflow.ratelimit.due.d_example.ID"},
		{heldSubject("d.example", "ID"), "outflow.retry.held.d_example.ID"},
		{deadSubject("ID"), "outflow.dead.ID"},
		{workFilter("*", "*", "ID"), "outflow.work.*.*.ID"},
		{schedFilter(LaneRateLimit, "*", "ID"), "outflow.ratelimit.sched.*.ID"},
		{dueFilter(LaneRetry, "d_example", "*"), "outflow.retry.due.d_example.*"},
		{heldFilter("*", "ID"), "outflow.retry.held.*.ID"},
		{laneSubjects(LaneWork), "outflow.work.>"},
		{laneSubjects(LaneRetry), "outflow.retry.>"},
		{laneDueSubjects(LaneRateLimit), "outflow.ratelimit.due.>"},
		{tenantWorkSubjects("t_1"), "outflow.work.t_1.>"},
		{deadSubjects, "outflow.dead.>"},
		{eventsSubjects, "outflow.events.>"},
		{eventSubject(EventDelivered, "t1", "ID"), "outflow.events.delivered." + eventTenantShard("t1") + "." + eventIDShard("ID")},
		{strings.Join(EventTenantFilters(EventDelivered, "t1"), " "), "outflow.events.delivered." + eventTenantShard("t1") + ".* outflow.events.delivered.*"},
		{strings.Join(historyFilters("ID"), " "), "outflow.events.*.*." + eventIDShard("ID") + " outflow.events.*." + legacyEventShard("ID")},
		// The hashes are the layout too: FNV-1a, 32 bits; the legacy shard
		// is what daemons before tenant shards wrote.
		{eventTenantShard("t1") + " " + eventIDShard("ID") + " " + legacyEventShard("ID"), "16 360 b60"},
		{kvStream(BucketSent), "KV_outflow_sent"},
		{kvSubject(BucketSent, "ID.0"), "$KV.outflow_sent.ID.0"},
		{directGetSubject("KV_outflow_sent", "$KV.outflow_sent.ID.0"), "$JS.API.DIRECT.GET.KV_outflow_sent.$KV.outflow_sent.ID.0"},
		{deadID(deadSubject("ID")), "ID"},
		{workTenant(workSubject("t.1", "d.example", "ID")), "t_1"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
