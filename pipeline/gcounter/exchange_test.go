package gcounter

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/decision"
)

func TestQuotaRecordRoundTrip(t *testing.T) {
	q := decision.QuotaCount{Rule: "daily", Tag: "0123456789abcdef0123456789abcdef", Window: time.UnixMilli(1_764_460_800_000).UTC(),
		End: time.UnixMilli(1_764_547_200_000).UTC(), Region: "eu-west", Count: 17}
	k, v, err := EncodeQuotaRecord(&q)
	if err != nil {
		t.Fatal(err)
	}
	if string(k) != "gc/daily/0123456789abcdef0123456789abcdef/1764460800000/eu-west" {
		t.Errorf("key %s", k)
	}
	got, err := DecodeQuotaRecord(k, v)
	if err != nil || got != q {
		t.Errorf("decoded %+v, %v; want %+v", got, err, q)
	}
	for _, c := range []struct{ key, value string }{
		{string(k), `{"format":2,"count":{}}`},
		{"gc/other", string(v)},
		{string(k), `{"format":1,"count":{"rule":"daily"},"extra":1}`},
		{string(k), `{"format":1,"count":{"rule":"daily","tag":"0123456789abcdef0123456789abcdef","window":"2025-11-30T00:00:00Z","end":"2025-12-01T00:00:00Z","region":"eu-west","count":-1}}`},
	} {
		if _, err := DecodeQuotaRecord([]byte(c.key), []byte(c.value)); !errors.Is(err, ErrBadQuotaRecord) {
			t.Errorf("%s %s: %v, want ErrBadQuotaRecord", c.key, c.value, err)
		}
	}
}

func FuzzDecodeQuotaRecord(f *testing.F) {
	q := decision.QuotaCount{Rule: "daily", Tag: "0123456789abcdef0123456789abcdef", Window: time.UnixMilli(0), End: time.UnixMilli(86_400_000), Region: "a", Count: 3}
	k, v, _ := EncodeQuotaRecord(&q)
	f.Add(k, v)
	f.Add([]byte("gc/x"), []byte(`{"format":1}`))
	f.Fuzz(func(t *testing.T, key, value []byte) {
		q, err := DecodeQuotaRecord(key, value)
		if err != nil {
			if !errors.Is(err, ErrBadQuotaRecord) {
				t.Fatalf("error %v does not wrap ErrBadQuotaRecord", err)
			}
			return
		}
		if QuotaKey(&q) != string(key) || q.Validate() != nil {
			t.Fatalf("decoded %+v under key %q", q, key)
		}
	})
}
