package queue

import (
	"encoding/json"
	"testing"
)

// go test -run '^$' -bench EnvelopeDecode -benchmem ./queue
//
// unmarshalEnvelope is the JSON decode DecodeEnvelope does now;
// json.Unmarshal is what it did before. The JSON is as data writes it
// (with the newline before an inline body, which DecodeEnvelope keeps).
func BenchmarkEnvelopeDecode(b *testing.B) {
	for _, c := range []struct {
		name string
		e    *Envelope
	}{{"fresh-inline", sampleEnvelopes()[0]}, {"history-dsn", sampleEnvelopes()[1]}} {
		data, err := c.e.data()
		if err != nil {
			b.Fatal(err)
		}
		data = data[:len(data)-len(c.e.Body)]
		b.Run(c.name+"/unmarshalEnvelope", func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				var e Envelope
				if err := unmarshalEnvelope(data, &e); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/json.Unmarshal", func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				var e Envelope
				if err := json.Unmarshal(data, &e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
