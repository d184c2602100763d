package sidecar

import (
	_ "embed"

	"github.com/sluice-rl/sluice/rules"
)

//go:embed example-rules.yaml
//go:embed example-rules.yaml
var exampleRules []byte

// ExampleRules returns the rule set `sluice serve` uses when it is given
// none (example-rules.yaml, domain "sluice"): per client IP, per API key,
// logins per user (failing closed) and a daily tenant quota.
func ExampleRules() *rules.Set {
	s, err := rules.Parse("enforcer/sidecar/example-rules.yaml", exampleRules)
	if err != nil {
		panic(err) // the embedded file is tested
	}
	return s
}
