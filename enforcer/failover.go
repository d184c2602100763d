package enforcer

import (
	"context"
	"errors"
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
// except a reply that says it cannot take writes (see unavailable).
func breakerSuccess(err error) bool {
	return err == nil || (isReply(err) && !unavailable(err))
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
