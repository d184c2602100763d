package main

import "time"

// The try-out mode: `sluice serve` without --redis or REDIS_ADDR decides
// against an in-process Redis (miniredis). Its round trip is a loopback
// socket inside the same process, so it is never slow for a network reason,
// only when the process is short of CPU (a loaded laptop, a busy CI
// machine): with the sidecar's 10 ms budget most checks then fall to the
// failure modes (fail-open, no 429 ever). So the try-out's budget is the
// replay's, a second, unless --budget says otherwise.
const (
	sidecarBudget = 10 * time.Millisecond
	tryOutBudget  = time.Second
)

// defaultBudget is the budget serve uses when none is given: tryOutBudget
// with the in-process Redis, else sidecarBudget.
func defaultBudget(c *serveConfig) time.Duration {
	if len(c.Redis) == 0 {
		return tryOutBudget
	}
	return sidecarBudget
}

// tryOutWarning is what serve logs at start with the in-process Redis.
func tryOutWarning(c *serveConfig) string {
	return "no Redis given (--redis or REDIS_ADDR): using an in-process Redis, for trying sluice out; its counters live and die with this process and no other sidecar shares them; decisions get a budget of " +
		c.Limiter.Budget.String() + " (an in-process Redis is slow only when the machine is busy, never for a network reason; --budget sets another)"
}
