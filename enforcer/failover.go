package enforcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// unavailable reports a Redis error reply that says the node cannot take
// writes now, and so ran nothing of the script: READONLY (a replica, such as
// a master demoted by a failover: a script without flags runs on a replica
// until its first write, which fails and aborts it, and every write fails
// there, so none can have happened), LOADING (the dataset is still being
// loaded), MASTERDOWN (a replica cut off from its master, with
// replica-serve-stale-data no) and CLUSTERDOWN (the cluster has slots no
// master serves, as during a failover after a master failed).
//
// The decision falls to the rules' failure modes, and the reply counts as a
// failure for the circuit breaker: a demoted master answering READONLY to
// every call is Redis unavailable for writes, however fast it answers.
func unavailable(err error) bool {
	return err != nil && isReply(err) &&
		(redis.IsReadOnlyError(err) || redis.IsLoadingError(err) || redis.IsMasterDownError(err) || redis.IsClusterDownError(err))
}

// breakerSuccess is the circuit breaker's IsSuccessful: an answer from Redis,
// even an error reply (NOSCRIPT, MOVED, a script error), shows it serving,
// except a reply that refuses every decision however fast it comes: it
// cannot take writes (see unavailable), or it refuses sluice's credentials,
// permissions or writes (NOAUTH, WRONGPASS, NOPERM, OOM, MISCONF; see
// RedisCause.Refusal). A Redis that answers PING but NOPERM to EVALSHA is
// down for the limiter.
func breakerSuccess(err error) bool {
	return err == nil || (isReply(err) && !unavailable(err) && !ClassifyRedisError(err).Refusal())
}

// staleRoute reports a Cluster call's error after which the client's slot
// map may be out of date: a redirection (MOVED, ASK); a node that is no
// longer the slot's writable master (READONLY, MASTERDOWN: demoted by a
// failover; LOADING: restarted; CLUSTERDOWN); or no answer at all (a
// refused or broken connection, a timeout), as from a master that failed
// and that its replica is replacing. go-redis reloads the map by itself only
// every ClusterStateReloadInterval (60 s) or in its redirect loop, which the
// limiter does not use. A caller's cancellation says nothing.
func staleRoute(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrLate) {
		return false
	}
	return isMoved(err) || unavailable(err) || !isReply(err)
}

// misrouted records a MOVED or ASK reply from a Redis that the limiter was
// given as a single node (or Sentinel group): it is a Redis Cluster node, and
// every key of another node's slots will answer the same. It is counted, and
// Misrouted reports it from then on.
func (l *Limiter) misrouted(err error) {
	l.movedN.Add(1)
	if l.moved.CompareAndSwap(nil, &err) {
		l.opts.Logger.Error("redis answers MOVED: it is a Redis Cluster node, given as a single node; decisions of other nodes' slots fall to the failure modes (give a Cluster client: sluice serve --redis-cluster)", "err", err)
	}
}

// ErrMisrouted is wrapped by Misrouted's answer.
var ErrMisrouted = errors.New("enforcer: Redis answered MOVED: it is a Redis Cluster node, given as a single node (sluice serve --redis-cluster)")

// Misrouted returns an error, wrapping ErrMisrouted, once a Redis given as a
// single node (this region's, or a home region's) has answered MOVED or ASK:
// it is a Cluster node, and the decisions of the other nodes' slots fall to
// the failure modes until the limiter is given a Cluster client. Nil before.
// The sidecar is unready from then on.
func (l *Limiter) Misrouted() error {
	if p := l.moved.Load(); p != nil {
		return fmt.Errorf("%w: %w", ErrMisrouted, *p)
	}
	return nil
}

// warnDialRetries warns about a client that dials a refused connection again:
// go-redis pauses DialerRetryTimeout (100 ms) between its DialerRetries
// attempts (5 by default). A decision's pause ends at its budget, but a dial
// for the pool's idle connections (MinIdleConns) waits them out, and each
// refused dial is a failure the breaker counts only once.
func warnDialRetries(dials int, log *slog.Logger) {
	if dials > 1 {
		log.Warn("the Redis client dials a refused connection again after 100 ms pauses: against a Redis that refuses connections that only spends the budget; set DialerRetries: 1", "dialer_retries", dials)
	}
}
