package queue

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sampleEnvelopes() []*Envelope {
	at := time.Date(2026, 12, 2, 5, 6, 7, 123456789, time.UTC)
	body := bytes.Repeat([]byte("0123456789abcdef"), 128) // 2 KiB
	weird := "550 5.1.1 <user@example> \"quoted\" \\ back\r\n\ttab \x00\x1f & > \u2028\u2029 ü 日本 \xff\xfe end"
	return []*Envelope{
		// A fresh submission's envelope, body inline, as Enqueue writes it.
		{ID: "01JABCDEFGHIJKLMNOPQRS", MsgID: "01JABCDEFGHIJKLMNOPQRS", Tenant: "billing", From: "bounce@billing.example",
			Rcpts: []string{"a@one.example"}, Dest: "one.example", Body: body, Size: int64(len(body)), Parts: 1,
			SubmittedAt: at, MessageID: "<x.1@billing.example>", Source: SourceSMTP},
		// Object Store body, history, DSN, every flag.
		{ID: "abc-2", MsgID: "abc", Tenant: "t", From: "", Rcpts: []string{"a@b", "c@b", weird}, Dest: "b", Group: "google", BodyRef: "abc",
			Signed: true, SigLen: 812, Size: 1 << 40, Parts: 3, SubmittedAt: at.In(time.FixedZone("x", -(5*3600 + 30*60))),
			History: []Attempt{
				{At: at, Attempt: 1, Worker: "w/1", Class: "tempfail", Rule: "4xx", Code: 451, Enhanced: "4.7.1",
					Reply: weird, Lane: "retry-5m", DelayMs: 300000, JitterSeed: "17", Rcpts: 2},
				{At: at.Add(time.Minute).Truncate(time.Second), Attempt: 2, Worker: "w/2", Class: "throttled", Code: -1},
				{},
			},
			Source: SourceAPI, IsReport: true, DelayWarned: true, PassNoted: true, DelayNoted: 2, SendAt: at.Add(time.Hour), ListUnsubscribe: true,
			DSN: &DSNParams{Ret: "FULL", EnvID: "e<1>", Rcpts: map[string]RcptDSN{
				"c@b":  {Notify: []string{NotifySuccess, NotifyDelay}, ORcpt: "C@b", ORcptType: "rfc822"},
				"a@b":  {ORcptType: "utf-8"},
				weird:  {},
				"\xff": {Notify: []string{}},
				"B@b":  {Notify: []string{NotifyNever}},
			}}},
		// Empty and nil collections: json.Marshal writes [] for an empty
		// slice without omitempty, null for a nil one, {} for an empty DSN.
		{ID: "x", Rcpts: []string{}, History: []Attempt{}, DSN: &DSNParams{Rcpts: map[string]RcptDSN{}}},
		{},
		{DSN: &DSNParams{EnvID: "only"}, SigLen: -3, Parts: -1, Size: -9, DelayNoted: -1, Body: []byte{}},
		// Header-only fields do not appear in the JSON.
		{ID: "h", Rcpts: []string{"a@b"}, Dest: "b", BodyRef: "h", Attempt: 4, FirstAttempt: at, Deadline: at,
			LastClass: "c", LastReply: "r", ThrottleCount: 1, Replays: 2, Step: 3, Probe: true, NotBefore: at},
	}
}

// The hand-written encoder writes exactly what json.Marshal writes, and
// data what the json.Encoder that wrote it before did.
func TestEnvelopeJSONMatchesMarshal(t *testing.T) {
	for i, e := range sampleEnvelopes() {
		want, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := e.appendJSON(nil)
		if !ok || !bytes.Equal(got, want) {
			t.Errorf("%d: appendJSON = %s, %v\nwant           %s", i, got, ok, want)
		}
		data, err := e.data()
		if err != nil {
			t.Fatal(err)
		}
		if old := oldEnvelopeData(t, e); !bytes.Equal(data, old) {
			t.Errorf("%d: data = %q\nwant     %q", i, data, old)
		}
	}
}

// oldEnvelopeData is the payload as data wrote it with encoding/json.
func oldEnvelopeData(t testing.TB, e *Envelope) []byte {
	if !e.Inline() {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var b bytes.Buffer
	b.Grow(512 + len(e.Body))
	if err := json.NewEncoder(&b).Encode(e); err != nil {
		t.Fatal(err)
	}
	b.Write(e.Body)
	return b.Bytes()
}

// Times json.Marshal refuses are refused, with json.Marshal's error.
func TestEnvelopeJSONRefusesWhatMarshalRefuses(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600)),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("farther", 100*3600)),
	} {
		for _, e := range []*Envelope{{SubmittedAt: at}, {History: []Attempt{{At: at}}}} {
			_, merr := json.Marshal(e)
			if merr == nil {
				t.Fatalf("json.Marshal accepted %v", at)
			}
			if b, ok := e.appendJSON(nil); ok {
				t.Errorf("appendJSON wrote %s for %v", b, at)
			}
			if _, err := e.data(); err == nil || err.Error() != merr.Error() {
				t.Errorf("data error %v, want %v", err, merr)
			}
		}
	}
	ok := &Envelope{SubmittedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("edge", -(23*3600+59*60)))}
	want, _ := json.Marshal(ok)
	if got, _ := ok.appendJSON(nil); !bytes.Equal(got, want) {
		t.Errorf("appendJSON = %s, want %s", got, want)
	}
}

func FuzzEnvelopeJSON(f *testing.F) {
	f.Add("abc", "a@b.example", "550 <a@b> & \"x\"", "FULL", "c@b", int64(1764651967), int64(123456789), int32(3600), int64(3), uint8(0xff))
	f.Add("\xff", "\u2028", "\x00\n\t", "", "\xfe", int64(-62135596800), int64(0), int32(-86399), int64(-1), uint8(0))
	f.Add("", "", "", "", "", int64(253402300800), int64(1), int32(86400), int64(0), uint8(0x55))
	f.Fuzz(func(t *testing.T, id, rcpt, text, ret, key string, sec, nsec int64, zone int32, n int64, flags uint8) {
		at := time.Unix(sec, nsec).In(time.FixedZone("z", int(zone)))
		bit := func(i uint) bool { return flags&(1<<i) != 0 }
		e := &Envelope{ID: id, MsgID: text, Tenant: key, From: rcpt, Rcpts: []string{rcpt, text}, Dest: key, BodyRef: ret,
			Signed: bit(0), SigLen: int(n), Size: n, Parts: int(n >> 3), SubmittedAt: at, MessageID: text, Source: ret,
			IsReport: bit(1), DelayWarned: bit(2), PassNoted: bit(3), DelayNoted: int(n)}
		if bit(7) {
			e.SendAt = at
		}
		if bit(4) {
			e.Rcpts = nil
		}
		if bit(5) {
			e.History = []Attempt{{At: at, Attempt: int(n), Worker: id, Class: key, Rule: text, Code: int(n), Enhanced: ret,
				Reply: text, Lane: rcpt, DelayMs: n, JitterSeed: id, Rcpts: int(n)}, {Reply: key}}
		}
		if bit(6) {
			e.DSN = &DSNParams{Ret: ret, EnvID: text}
			if bit(7) {
				e.DSN.Rcpts = map[string]RcptDSN{
					key:  {Notify: []string{text, ret}, ORcpt: rcpt},
					rcpt: {ORcptType: key},
					text: {},
					id:   {Notify: strings.Fields(text)},
				}
			}
		}
		if bit(7) && !bit(6) {
			e.Body = []byte(text)
		}
		if !matchesMarshal(t, e, e.appendJSON) {
			return
		}
		data, err := e.data()
		if err != nil {
			t.Fatal(err)
		}
		if old := oldEnvelopeData(t, e); !bytes.Equal(data, old) {
			t.Fatalf("data = %q\nwant     %q", data, old)
		}
	})
}

// go test -run '^$' -bench EnvelopeEncode -benchmem ./queue
//
// data is the payload as Encode writes it now; json.Encoder is the same
// payload as encoding/json wrote it before (the JSON by a json.Encoder
// into a bytes.Buffer, then the inline body).
func BenchmarkEnvelopeEncode(b *testing.B) {
	for _, c := range []struct {
		name string
		e    *Envelope
	}{{"fresh-inline", sampleEnvelopes()[0]}, {"history-dsn", sampleEnvelopes()[1]}} {
		b.Run(c.name+"/data", func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if _, err := c.e.data(); err != nil {
					b.Fatal(err)
				}
			}
		})
		if c.e.Inline() {
			// In front of the body, in the frame the listener read it
			// into (Submission.Frame): the body is not copied.
			b.Run(c.name+"/data-in-frame", func(b *testing.B) {
				e := *c.e
				e.frame, e.Body = inFrame(c.e.Body, FrameHeadroom(e.From, e.Rcpts, e.DSN != nil))
				b.ReportAllocs()
				defer reportCPU(b)()
				for b.Loop() {
					if _, err := e.data(); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
		b.Run(c.name+"/json.Encoder", func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				oldEnvelopeData(b, c.e)
			}
		})
	}
}

// unmarshalEnvelope gives json.Unmarshal's result on any input: the same
// envelope, or the same error. (It also keeps the members json.Unmarshal
// drops, Envelope.unknown: TestEnvelopeKeepsALaterReleasesFields.)
func checkUnmarshalEnvelope(t *testing.T, data []byte) (fast bool) {
	t.Helper()
	var want, got Envelope
	werr := json.Unmarshal(data, &want)
	gerr := unmarshalEnvelope(data, &got)
	got.unknown = nil
	if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
		t.Fatalf("unmarshalEnvelope(%q) error %v, json.Unmarshal %v", data, gerr, werr)
	}
	if werr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("unmarshalEnvelope(%q) =\n%#v\njson.Unmarshal:\n%#v", data, got, want)
	}
	var f Envelope
	return f.decodeJSONFast(data)
}

func TestUnmarshalEnvelopeMatchesUnmarshal(t *testing.T) {
	for i, e := range sampleEnvelopes() {
		b, ok := e.appendJSON(nil)
		if !ok {
			t.Fatal("refused")
		}
		for _, data := range [][]byte{b, append(b, '\n'), []byte(strings.ReplaceAll(string(b), ",", " ,\r\n\t"))} {
			// rcpts:null (no recipients: malformed anyway) is left to json.Unmarshal.
			if !checkUnmarshalEnvelope(t, data) && e.Rcpts != nil {
				t.Errorf("%d: fast decoder declined %s", i, data)
			}
		}
	}
	for _, s := range []string{
		`{}`, ` {} `, `[]`, `null`, ``, `{`, `{"id":"a"}x`, `{"id":"a","id":"b"}`, `{"ID":"a"}`, `{"id":null}`,
		`{"rcpts":null}`, `{"rcpts":[]}`, `{"history":[]}`, `{"history":[{}]}`, `{"dsn":{}}`, `{"dsn":null}`,
		`{"dsn":{"rcpts":{}}}`, `{"dsn":{"rcpts":{"a":{},"a":{"orcpt":"x"}}}}`, `{"dsn":{"rcpts":{"a":{"notify":[]}}}}`,
		`{"size":01}`, `{"size":-0}`, `{"size":1.0}`, `{"size":1e3}`, `{"size":-}`, `{"size":9223372036854775808}`,
		`{"sig_len":-9223372036854775808}`, `{"signed":tru}`, `{"signed":truex}`, `{"signed":"true"}`,
		`{"id":"a\u0000\u00e9\u2028\/\b\f\n\r\t\"\\"}`, `{"id":"\ud83d\ude00"}`, `{"id":"\ud800"}`, `{"id":"\x"}`,
		"{\"id\":\"\xff\"}", "{\"id\":\"\x01\"}", "{\"id\":\"日本\"}", `{"id":"\u00zz"}`, `{"unknown":1}`,
		`{"submitted_at":"2026-12-02T05:06:07.123456789+01:00"}`, `{"submitted_at":"2026-12-02"}`,
		`{"submitted_at":"2026-12-02T05:06:07\u005a"}`, `{"submitted_at":null}`, `{"submitted_at":5}`,
		`{"history":[{"at":"2026-12-02T05:06:07Z","attempt":1,"worker":"w","class":"c","code":451,"delay_ms":5,"rcpts":2}]}`,
		`{"history":[{"attempt":1,"attempt":2}]}`, `{"id":"a",}`, `{"id":"a" "b":1}`, `{"rcpts":["a",]}`,
	} {
		checkUnmarshalEnvelope(t, []byte(s))
	}
}

func FuzzUnmarshalEnvelope(f *testing.F) {
	for _, e := range sampleEnvelopes() {
		b, _ := e.appendJSON(nil)
		f.Add(b)
	}
	f.Add([]byte(`{"id":"a\u0000\u00e9\u2028\/\b\f\n\r\t\"\\","dsn":{"rcpts":{"a":{"notify":[]}}},"size":-0}`))
	f.Add([]byte(`{"id":"\ud83d\ude00","history":[{"at":"2026-12-02T05:06:07Z","attempt":1}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkUnmarshalEnvelope(t, data)
	})
}

// The samples set every field the JSON carries, of the envelope and of the
// types inside it, so a field added to one of them (which the hand-written
// encoder and decoder would not know) fails here until a sample sets it
// and TestEnvelopeJSONMatchesMarshal then compares it.
func TestEnvelopeSamplesCoverEveryField(t *testing.T) {
	seen := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				seen[prefix+k] = true
				walk(prefix+k+".", x)
			}
		case []any:
			for _, x := range v {
				walk(prefix, x)
			}
		}
	}
	for _, e := range sampleEnvelopes() {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		walk("", m)
	}
	var want func(prefix string, typ reflect.Type)
	want = func(prefix string, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ == reflect.TypeOf(time.Time{}) {
			return
		}
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if !seen[prefix+name] {
				t.Errorf("no sample sets %s%s (%s)", prefix, name, f.Type)
			}
			ft := f.Type
			if ft.Kind() == reflect.Map {
				// Map values sit under their keys: fold the keys the
				// samples use into one, "*", and check the values' fields
				// there.
				for k := range seen {
					if rest, ok := strings.CutPrefix(k, prefix+name+"."); ok {
						if _, field, ok := strings.Cut(rest, "."); ok {
							seen[prefix+name+".*."+field] = true
						}
					}
				}
				want(prefix+name+".*.", ft.Elem())
				continue
			}
			want(prefix+name+".", ft)
		}
	}
	want("", reflect.TypeOf(Envelope{}))
}
