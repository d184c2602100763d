package pipeline

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// EnsureTopics and EnsureOutputTopic create the output topic compacted (and
// deleted after a week): compaction keeps the newest share of each key, which
// is what a new region's applier must read.
func TestOutputTopicIsCompacted(t *testing.T) {
	for name, brokers := range map[string][]string{"EnsureTopics": newKafka(t), "EnsureOutputTopic": outputKafka(t)} {
		t.Run(name, func(t *testing.T) {
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, DefaultOutputTopic)
			if err != nil {
				t.Fatal(err)
			}
			rc, err := rcs.On(DefaultOutputTopic, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, c := range rc.Configs {
				if c.Value != nil {
					got[c.Key] = *c.Value
				}
			}
			if got["cleanup.policy"] != "compact,delete" || got["retention.ms"] != "604800000" {
				t.Errorf("output topic configs: cleanup.policy %q, retention.ms %q; want compact,delete and a week", got["cleanup.policy"], got["retention.ms"])
			}
		})
	}
}
