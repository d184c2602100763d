package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Poll waits up to 250 ms for up to max records, so that the caller's loop
// wakes to do its periodic work; ok is false once the client is closed or
// ctx has ended. Fetch errors, other than the Poll's own timeout, are
// logged; err is the first that retrying cannot cure (FatalFetchError), on
// which the caller stops and returns it, so that the process ends with it
// rather than polling a cluster that will never serve it.
func Poll(ctx context.Context, cl *kgo.Client, max int, log *slog.Logger) (fs kgo.Fetches, ok bool, err error) {
	pctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
	fs = cl.PollRecords(pctx, max)
	cancel()
	if fs.IsClientClosed() || ctx.Err() != nil {
		return fs, false, nil
	}
	fs.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			log.Warn("fetch failed", "topic", topic, "partition", p, "err", err)
		}
	})
	if err := FatalFetchError(fs); err != nil {
		return fs, false, err
	}
	return fs, true, nil
}

// fatalCodes are the Kafka errors that no retry cures: the cluster refuses
// this client its topics or its group (ACLs, SASL), or the group id. franz-go
// retries retriable errors itself and reports these in a fetch (for a group,
// in a fetch it injects); every other error is logged and polled past.
var fatalCodes = []*kerr.Error{
	kerr.TopicAuthorizationFailed, kerr.GroupAuthorizationFailed, kerr.ClusterAuthorizationFailed,
	kerr.TransactionalIDAuthorizationFailed, kerr.SaslAuthenticationFailed, kerr.InvalidGroupID,
}

// FatalFetchError returns the first error in fs that retrying cannot cure
// (an authorization or authentication failure, an invalid group id), wrapped
// with its topic and partition; nil if there is none.
func FatalFetchError(fs kgo.Fetches) error {
	var fatal error
	fs.EachError(func(topic string, p int32, err error) {
		if fatal != nil {
			return
		}
		for _, code := range fatalCodes {
			if errors.Is(err, code) {
				fatal = fmt.Errorf("kafka refuses this client (topic %q, partition %d): %w", topic, p, err)
				return
			}
		}
	})
	return fatal
}

// commitWithMetadata commits an offset for each given partition of topic,
// each with its metadata string (Kafka's offset commit metadata, which the
// next owner reads back in kgo.OnOffsetsFetched). It returns the request's
// error or the first partition's.
func commitWithMetadata(ctx context.Context, cl *kgo.Client, topic string, offsets map[int32]int64, meta map[int32]string) error {
	eo := make(map[int32]kgo.EpochOffset, len(offsets))
	for p, off := range offsets {
		eo[p] = kgo.EpochOffset{Epoch: -1, Offset: off}
	}
	cctx := kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			if req.Topics[i].Topic != topic {
				continue
			}
			for j := range req.Topics[i].Partitions {
				p := &req.Topics[i].Partitions[j]
				if m, ok := meta[p.Partition]; ok {
					p.Metadata = &m
				}
			}
		}
		return nil
	})
	var cerr error
	done := make(chan struct{})
	cl.CommitOffsetsSync(cctx, map[string]map[int32]kgo.EpochOffset{topic: eo},
		func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
			defer close(done)
			cerr = err
			if err != nil {
				return
			}
			for _, t := range resp.Topics {
				for _, p := range t.Partitions {
					if cerr == nil {
						cerr = kerr.ErrorForCode(p.ErrorCode)
					}
				}
			}
		})
	<-done
	return cerr
}

// ApplyGroupOpts are the client options of a consumer group that applies
// what it reads somewhere (a region's Redis, ClickHouse) and commits only
// past what that took: group's members read brokers' topics from their
// start, commit by hand, and block rebalances while a poll's records are
// applied. The balancer is eager: every rebalance revokes every partition,
// and the next assignment starts from the committed offsets, so a batch
// given up to let a rebalance through is read again. yield, when not nil,
// is set while a rebalance waits, for the applying loop to give up its
// retries.
func ApplyGroupOpts(brokers []string, group string, topics []string, yield *atomic.Bool) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topics...),
		kgo.Balancers(kgo.RangeBalancer()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}
	if yield != nil {
		opts = append(opts, kgo.OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { yield.Store(true) }))
	}
	return opts
}

// RewindIfLost is how an applying group (see ApplyGroupOpts) recovers a
// store that lost what it applied: when present reports its mark gone (a
// Redis that restarted empty), every partition of topic is set back to its
// start (SetOffsets skips those not assigned here), the mark is set again,
// and it returns the partitions and true. A store that does not answer is
// left to the writes' retries. Call it between a poll and AllowRebalance,
// as SetOffsets wants.
func RewindIfLost(ctx context.Context, cl *kgo.Client, topic string, present func(context.Context) (bool, error), mark func(context.Context) error) (int32, bool) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if ok, err := present(cctx); err != nil || ok {
		return 0, false
	}
	np, err := partitions(cctx, kadm.NewClient(cl), topic)
	if err != nil {
		return 0, false
	}
	start := map[int32]kgo.EpochOffset{}
	for p := range np {
		start[p] = kgo.EpochOffset{Epoch: -1, Offset: 0}
	}
	cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{topic: start})
	_ = mark(cctx) // failed: read again anyway; the next check marks it
	return np, true
}
