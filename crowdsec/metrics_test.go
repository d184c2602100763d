package crowdsec

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// TestMetricsLint: every metric of a Bouncer and an AlertPusher is named
// sluice_crowdsec_* and passes Prometheus's linter (promlint).
func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewRegistry()
	cl, err := NewClient(ClientOptions{URL: "http://127.0.0.1:1", APIKey: "k", MachineID: "m", Password: "p"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewBouncer(Options{Source: cl, Regions: []Region{{"eu", nil}}, Registerer: reg}); err == nil {
		t.Error("a region without a store: no error")
	}
	if _, err := NewBouncer(Options{Source: cl, Regions: []Region{{"eu", fakeStore{}}, {"us", fakeStore{}}}, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := NewAlertPusher(AlertOptions{Client: cl, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) < 15 {
		t.Errorf("%d metric families", len(mfs))
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "sluice_crowdsec_") {
			t.Errorf("metric %s", mf.GetName())
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil || len(problems) > 0 {
		t.Errorf("promlint: %v %+v", err, problems)
	}
}

// fakeStore is a RegionStore for constructors that never call it.
type fakeStore struct{ RegionStore }
