package sidecar

import (
	"strings"

	"github.com/sluice-rl/sluice/enforcer"
)

// probeLine is /readyz's redis line for a failed readiness probe: the
// cause, the node, Redis's reply (which names a refused command) and what
// to look at.
func probeLine(st enforcer.RedisStatus) string {
	var b strings.Builder
	b.WriteString("redis: the decision script fails (cause ")
	b.WriteString(st.Cause.String())
	b.WriteString(")")
	if st.Node != "" {
		b.WriteString(" on master " + st.Node)
	}
	b.WriteString(": " + st.Err.Error())
	if h := enforcer.CauseHint(st.Cause); h != "" {
		b.WriteString("; " + h)
	}
	b.WriteString(" (decisions follow each rule's failure mode)\n")
	return b.String()
}

// policyLine is /readyz's line on Redis's maxmemory-policy.
func policyLine(st enforcer.PolicyStatus) string {
	switch {
	case len(st.Policies) == 0 && st.Err != nil:
		return "redis maxmemory-policy: unknown (" + st.Err.Error() + ")\n"
	case len(st.Policies) == 0:
		return "redis maxmemory-policy: not read yet\n"
	case st.Evicting && st.Allowed:
		return "redis maxmemory-policy: " + strings.Join(st.Policies, ", ") + ": can evict live counters and reset limits (allowed by --redis-allow-eviction)\n"
	case st.Evicting:
		return "redis maxmemory-policy: " + strings.Join(st.Policies, ", ") + ": can evict live counters and reset limits: run noeviction\n"
	}
	return "redis maxmemory-policy: " + strings.Join(st.Policies, ", ") + "\n"
}

// homeLine is /readyz's line on a home region's Redis (Options.HomeProbes).
func homeLine(region string, st enforcer.RedisStatus) string {
	switch {
	case st.At.IsZero():
		return "home redis " + region + ": not probed yet\n"
	case st.Err == nil:
		return "home redis " + region + ": ok\n"
	}
	line := "home redis " + region + ": the decision script fails (cause " + st.Cause.String() + "): " + st.Err.Error()
	if h := enforcer.CauseHint(st.Cause); h != "" {
		line += "; " + h
	}
	return line + " (the rules homed there follow their failure modes)\n"
}
