package store

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// InstancesKey is the region's live enforcers: a sorted set of instance ids
// scored by when each entry expires (ms, Redis TIME), renewed by each
// enforcer's heartbeat (Heartbeat). The key's own TTL is the last
// heartbeat's, so a region whose enforcers all stopped leaves nothing.
const InstancesKey = "sluice:instances"

// heartbeatScript renews ARGV[1]'s entry for ARGV[2] ms, drops the expired
// ones, and returns how many are live; on Redis's clock, so that enforcers'
// skewed clocks neither keep a dead one nor drop a live one.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
`)

// Heartbeat renews instance's entry in InstancesKey for ttl and returns the
// number of live enforcers in the region (this one included): those whose
// last heartbeat is younger than its ttl. One round trip. instance must be
// unique among the region's live enforcers (a name and a random nonce): two
// that share it count as one. An enforcer that stops is counted until its
// ttl runs out, unless it leaves (Leave).
func (s *Store) Heartbeat(ctx context.Context, instance string, ttl time.Duration) (int, error) {
	n, err := heartbeatScript.Run(ctx, s.rdb, []string{InstancesKey}, instance, max(1, ttl.Milliseconds())).Int()
	if err != nil {
		return 0, fmt.Errorf("heartbeat: %w", err)
	}
	return n, nil
}

// Leave removes instance's entry from InstancesKey: an enforcer that stops
// gracefully is not counted for the rest of its heartbeat's ttl (the others
// would divide their fallback by one too many meanwhile).
func (s *Store) Leave(ctx context.Context, instance string) error {
	if err := s.rdb.ZRem(ctx, InstancesKey, instance).Err(); err != nil {
		return fmt.Errorf("leaving %s: %w", InstancesKey, err)
	}
	return nil
}
