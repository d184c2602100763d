package decision

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rl/sluice/decision/decisionpb"
	"github.com/sluice-rl/sluice/rules"
)

func sampleRecord() Record {
	r := Record{
		Time: time.UnixMilli(1544869111000), Region: "eu", Instance: "0", RequestID: "f0:12",
		Domain: "api", UserAgent: "python-requests/2.19", Matched: []string{"per-ip", "dyn-x"},
		Outcome: ShadowDenied, DenyingRule: "dyn-x", Cost: 2, Remaining: 7, Latency: 150 * time.Microsecond, Status: 200,
	}
	r.Descriptors[rules.KeyClientIP] = "198.51.100.7"
	r.Descriptors[rules.KeyASN] = "64512"
	r.Descriptors[rules.KeyJA4] = "t13d1516h2_8daaf6152771_b186095e22b6"
	r.Descriptors[rules.KeyRoute] = "/login"
	return r
}

func TestRoundTrip(t *testing.T) {
	rec := sampleRecord()
	var d decisionpb.Decision
	ToProto(&rec, &d)
	b, err := proto.Marshal(&d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, &d) {
		t.Fatalf("round trip changed the record:\n%v\n%v", got, &d)
	}
	if Descriptors(got) != rec.Descriptors {
		t.Errorf("descriptors %v, want %v", Descriptors(got), rec.Descriptors)
	}
	if got.Outcome != decisionpb.Outcome_OUTCOME_SHADOW_DENIED || got.EventTimeMs != 1544869111000 || got.LatencyUs != 150 {
		t.Errorf("fields: %v", got)
	}
}

func TestDecodeRejects(t *testing.T) {
	good := sampleRecord()
	for name, mut := range map[string]func(*decisionpb.Decision){
		"future version":  func(d *decisionpb.Decision) { d.Version = SchemaVersion + 1 },
		"no version":      func(d *decisionpb.Decision) { d.Version = 0 },
		"unknown outcome": func(d *decisionpb.Decision) { d.Outcome = 42 },
		"no event time":   func(d *decisionpb.Decision) { d.EventTimeMs = 0 },
		"year 9999":       func(d *decisionpb.Decision) { d.EventTimeMs = 253402300799000 },
		"huge client ip":  func(d *decisionpb.Decision) { d.Descriptors.ClientIp = strings.Repeat("1", MaxValueLen+1) },
		"huge path":       func(d *decisionpb.Decision) { d.Descriptors.Path = "/" + strings.Repeat("a", MaxPathLen) },
		"huge rule id":    func(d *decisionpb.Decision) { d.MatchedRules = []string{strings.Repeat("r", MaxValueLen+1)} },
		"too many rules":  func(d *decisionpb.Decision) { d.MatchedRules = make([]string, MaxListLen+1) },
	} {
		var d decisionpb.Decision
		ToProto(&good, &d)
		mut(&d)
		b, _ := proto.Marshal(&d)
		if _, err := Decode(b); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%s: err %v, want ErrBadRecord", name, err)
		}
	}
	if _, err := Decode([]byte{0xff, 0xff, 0xff}); !errors.Is(err, ErrBadRecord) {
		t.Errorf("garbage: %v", err)
	}
}

func TestRecordKeyPrefersAPIKey(t *testing.T) {
	var d rules.Descriptors
	if RecordKey(&d) != nil {
		t.Error("empty descriptors must give a nil key")
	}
	d[rules.KeyClientIP] = "1.2.3.4"
	if string(RecordKey(&d)) != "client_ip=1.2.3.4" {
		t.Error(string(RecordKey(&d)))
	}
	d[rules.KeyAPIKey] = "k1"
	if string(RecordKey(&d)) != "api_key=k1" {
		t.Error(string(RecordKey(&d)))
	}
}

func FuzzDecode(f *testing.F) {
	rec := sampleRecord()
	var d decisionpb.Decision
	ToProto(&rec, &d)
	b, _ := proto.Marshal(&d)
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{0x08, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("error %v does not wrap ErrBadRecord", err)
			}
			return
		}
		// A record that decodes re-encodes to one that decodes the same.
		b2, err := proto.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		d2, err := Decode(b2)
		if err != nil || !proto.Equal(d, d2) {
			t.Fatalf("re-decode: %v", err)
		}
	})
}

// TestInvalidUTF8StillEncodes: a request whose user agent, path or key holds
// bytes that are not UTF-8 still makes a record (protobuf strings must be
// UTF-8), with U+FFFD in their place, so an abuser cannot hide from the
// detector behind one bad byte.
func TestInvalidUTF8StillEncodes(t *testing.T) {
	rec := sampleRecord()
	rec.UserAgent = "curl/\xff\xfe"
	rec.Descriptors[rules.KeyPath] = "/a\xc3"
	rec.Descriptors[rules.KeyAPIKey] = "k\x80y"
	var d decisionpb.Decision
	ToProto(&rec, &d)
	b, err := proto.Marshal(&d)
	if err != nil {
		t.Fatalf("a record with invalid UTF-8 did not encode: %v", err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.UserAgent != "curl/\uFFFD" || got.Descriptors.Path != "/a\uFFFD" || got.Descriptors.ApiKey != "k\uFFFDy" {
		t.Errorf("user agent %q, path %q, api key %q", got.UserAgent, got.Descriptors.Path, got.Descriptors.ApiKey)
	}
}

// A record with a padded header still decodes: its long fields are cut to
// the decoder's bounds at a character boundary (reported), and the client
// stays visible; an ordinary record is not cut.
func TestToProtoCutsLongFields(t *testing.T) {
	rec := sampleRecord()
	var d decisionpb.Decision
	if ToProto(&rec, &d) {
		t.Fatal("an ordinary record was cut")
	}
	rec.Descriptors[rules.KeyAPIKey] = "eyJ" + strings.Repeat("a", 1500)
	rec.UserAgent = strings.Repeat("é", MaxPathLen) // 2 bytes each
	rec.Descriptors[rules.KeyPath] = "/" + strings.Repeat("x", 9000)
	if !ToProto(&rec, &d) {
		t.Fatal("long fields were not reported cut")
	}
	b, err := proto.Marshal(&d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatalf("the cut record does not decode: %v", err)
	}
	if len(got.Descriptors.ApiKey) != MaxValueLen || len(got.UserAgent) != MaxPathLen || !utf8.ValidString(got.UserAgent) ||
		len(got.Descriptors.Path) != MaxPathLen || got.Descriptors.ClientIp != "198.51.100.7" {
		t.Errorf("api key %d bytes, user agent %d (valid %v), path %d, client %q", len(got.Descriptors.ApiKey), len(got.UserAgent),
			utf8.ValidString(got.UserAgent), len(got.Descriptors.Path), got.Descriptors.ClientIp)
	}
}

// TestDecodeSkipsUnknownFields: a record from a newer producer of the same
// schema version, with fields this consumer does not know (in the Decision
// and in its Descriptors), decodes to the same decision
// (docs/decision-records.md, "Versions and unknown fields").
func TestDecodeSkipsUnknownFields(t *testing.T) {
	var d decisionpb.Decision
	rec := sampleRecord()
	ToProto(&rec, &d)
	known, err := proto.Marshal(&d)
	if err != nil {
		t.Fatal(err)
	}
	// Field 99 (a varint, 7) and field 100 (bytes, "new") on the Decision;
	// field 50 (bytes) inside a second Descriptors occurrence, which
	// protobuf merges into the first.
	extra := append([]byte(nil), known...)
	extra = protowire.AppendTag(extra, 99, protowire.VarintType)
	extra = protowire.AppendVarint(extra, 7)
	extra = protowire.AppendTag(extra, 100, protowire.BytesType)
	extra = protowire.AppendString(extra, "new")
	var desc []byte
	desc = protowire.AppendTag(desc, 50, protowire.BytesType)
	desc = protowire.AppendString(desc, "a descriptor from the future")
	extra = protowire.AppendTag(extra, 7, protowire.BytesType)
	extra = protowire.AppendBytes(extra, desc)

	got, err := Decode(extra)
	if err != nil {
		t.Fatalf("Decode with unknown fields: %v", err)
	}
	if len(got.ProtoReflect().GetUnknown()) == 0 || len(got.GetDescriptors().ProtoReflect().GetUnknown()) == 0 {
		t.Errorf("the unknown fields were not kept as unknown: the test did not write what it meant to")
	}
	want, err := Decode(known)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(stripUnknown(got), want) {
		t.Errorf("with unknown fields the record decodes to\n%v\nwant\n%v", got, want)
	}
}

// stripUnknown drops d's unknown fields, and its descriptors'.
func stripUnknown(d *decisionpb.Decision) *decisionpb.Decision {
	d = proto.Clone(d).(*decisionpb.Decision)
	d.ProtoReflect().SetUnknown(nil)
	if x := d.GetDescriptors(); x != nil {
		x.ProtoReflect().SetUnknown(nil)
	}
	return d
}
