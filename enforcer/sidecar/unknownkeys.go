package sidecar

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/sluice-rl/sluice/rules"
)

// unknownKeys counts descriptor entries whose key means nothing to the rule
// set (no static or dynamic rule matches it, and it is not the shedding
// block's priority key), and says so in the log at most once a minute, with
// the key: a misspelt key (remote_adress for remote_address) matches no
// rule, and the request is allowed without a limit and without an error.
// Only custom keys can be such: every well-known key and alias has a
// meaning of its own.
type unknownKeys struct {
	count prometheus.Counter
	log   rate.Sometimes
}

func newUnknownKeys() *unknownKeys {
	return &unknownKeys{
		count: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_sidecar_unknown_descriptor_keys_total",
			Help: "Descriptor entries of the rule set's domain whose key no rule matches (a misspelt or undeclared custom key): they limit nothing.",
		}),
		log: rate.Sometimes{First: 1, Interval: time.Minute},
	}
}

// check counts the custom keys of req's parts that set and its dynamic
// rules do not name. It allocates nothing unless it logs.
func (s *Server) checkUnknownKeys(set *rules.Set, sc *scratch) {
	for pi := range sc.req.Parts {
		d := &sc.req.Parts[pi].Descriptors
		for i := range rules.MaxCustom {
			name, v := d.CustomAt(i)
			if name == "" || v == "" || set.NamesKey(name) || s.lim.DynamicNamesKey(name) {
				continue
			}
			s.unknown.count.Inc()
			s.unknown.log.Do(func() {
				s.opts.Logger.Warn("a descriptor key that no rule matches: it limits nothing (a misspelt key, or a custom key the rule file does not use); at most one such line a minute",
					"key", name, "domain", set.Domain)
			})
		}
	}
}
