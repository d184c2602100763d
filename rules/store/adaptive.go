package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// AdaptiveKey is a hash of each enforcer's adaptive factor in the region
// (see enforcer's adaptive limits): field the enforcer's instance name,
// value "<factor> <Unix ms>". TTL adaptiveTTL, renewed by every write;
// entries older than the reader's maxAge are ignored.
const AdaptiveKey = "sluice:adaptive"

// adaptiveTTL is AdaptiveKey's TTL: a region whose enforcers all stopped
// leaves nothing behind for long.
const adaptiveTTL = 10 * time.Minute

// PutAdaptive records instance's adaptive factor at now, and returns the
// region's factor: the mean of the factors recorded within maxAge of now
// (this one included), and how many there were. One round trip (a
// pipeline of HSET, PEXPIRE and HGETALL). Entries that do not parse are
// skipped.
func (s *Store) PutAdaptive(ctx context.Context, instance string, factor float64, now time.Time, maxAge time.Duration) (region float64, n int, err error) {
	var all *redis.MapStringStringCmd
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, AdaptiveKey, instance, strconv.FormatFloat(factor, 'g', -1, 64)+" "+strconv.FormatInt(now.UnixMilli(), 10))
		p.PExpire(ctx, AdaptiveKey, adaptiveTTL)
		all = p.HGetAll(ctx, AdaptiveKey)
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("sharing the adaptive factor: %w", err)
	}
	sum := 0.0
	for _, v := range all.Val() {
		fs, ms, ok := strings.Cut(v, " ")
		if !ok {
			continue
		}
		f, err1 := strconv.ParseFloat(fs, 64)
		at, err2 := strconv.ParseInt(ms, 10, 64)
		if err1 != nil || err2 != nil || !(f > 0 && f <= 1) {
			continue
		}
		if age := now.Sub(time.UnixMilli(at)); age > maxAge || age < -maxAge {
			continue
		}
		sum += f
		n++
	}
	if n == 0 {
		return factor, 0, nil
	}
	return sum / float64(n), n, nil
}
