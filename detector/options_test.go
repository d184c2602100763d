package detector

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// Options a rule store would refuse, or that would exhaust memory or never
// compare true, are refused by the constructors with an error that names
// them; the zero value takes every default.
func TestSignalsRefuseBadOptions(t *testing.T) {
	if _, err := Signals(Options{}); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{HeavyHitters: HeavyHitterOptions{Window: 1500 * time.Microsecond}}, "Window 1.5ms"},
		{Options{HeavyHitters: HeavyHitterOptions{Window: -time.Second}}, "Window -1s"},
		{Options{Clusters: ClusterOptions{Window: 2 * time.Hour}}, "Window 2h0m0s"},
		{Options{Entropy: EntropyOptions{TTL: 25 * time.Hour}}, "TTL 25h0m0s"},
		{Options{NewIdentities: NewIdentityOptions{TTL: time.Second}}, "TTL 1s"},
		{Options{HeavyHitters: HeavyHitterOptions{K: 1 << 40}}, "K 1099511627776"},
		{Options{Entropy: EntropyOptions{K: -1}}, "K -1"},
		{Options{HeavyHitters: HeavyHitterOptions{Factor: math.NaN()}}, "Factor NaN"},
		{Options{Clusters: ClusterOptions{LimitFactor: math.Inf(1)}}, "LimitFactor +Inf"},
		{Options{Clusters: ClusterOptions{MinShare: 1.5}}, "MinShare 1.5"},
		{Options{Clusters: ClusterOptions{Trigger: 2, Clear: 3}}, "Clear 3 above Trigger 2"},
		{Options{NewIdentities: NewIdentityOptions{Warmup: 100}}, "Warmup 100"},
		{Options{Entropy: EntropyOptions{Limit: -5}}, "Limit -5"},
		{Options{FakeCrawlers: FakeCrawlerOptions{Crawlers: []Crawler{{Name: "x", Token: " ", ASNs: []uint32{1}}}}}, `crawler 0 ("x")`},
		{Options{FakeCrawlers: FakeCrawlerOptions{Crawlers: []Crawler{{Name: "y", Token: "ybot"}}}}, `crawler 0 ("y")`},
	} {
		_, err := Signals(tc.o)
		if !errors.Is(err, ErrBadOptions) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one naming %q", tc.o, err, tc.want)
		}
	}
}
