package enforcer_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/enforcer"
	"github.com/sluice-rl/sluice/internal/redistest"
	"github.com/sluice-rl/sluice/rules"
)

// An envoyproxy config's exact IPv6 address, read as its /64, cannot match
// under another Options.IPv6Prefix: New says so, naming the rule.
func TestWarnsAboutIPv6NetworksUnderAnotherPrefix(t *testing.T) {
	set, err := rules.ParseEnvoy("e.yaml", []byte("domain: d\ndescriptors:\n  - key: remote_address\n    value: 2001:db8::7\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := enforcer.New(redistest.Server(t), set, enforcer.Options{IPv6Prefix: 128, Logger: log}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "IPv6 /64") || !strings.Contains(logs.String(), "rule=remote_address_2001-db8-7") {
		t.Errorf("no warning naming the rule:\n%s", logs.String())
	}
}
