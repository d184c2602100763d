#!/usr/bin/env bash
# Measures sluice serve's request path (Envoy RLS v3 over gRPC, one Redis) with rlsload, the
# closed-loop load generator in shared/tools/rlsload, beside envoyproxy/ratelimit (the peer) built
# and run by this script on the same rules, and prints a markdown table of medians with ratios.
#
#   deploy/bench/rls.sh                      # or: make bench-rls
#   ROUNDS=1 WORKERS="16" DESCS="1 4" DURATION=2s WARMUP=1s deploy/bench/rls.sh
#   PEER=none deploy/bench/rls.sh            # sluice alone
#   DENY=1 WORKERS=16 DESCS=1 deploy/bench/rls.sh      # accuracy: measured vs expected deny fraction
#
# Environment: ROUNDS (3), WORKERS ("16 64 256"), DESCS ("1 4"), DURATION (10s), WARMUP (2s),
# SERVE_FLAGS (extra `sluice serve` flags, word-split; later flags override ours, e.g.
# "--drain-delay 5s"), OUT (where the raw JSON lines go; default a fresh temporary folder, kept),
# RLSLOAD_DIR (default <repo>/../shared/tools/rlsload), GO (go), DENY (0), DENY_FRAC (0.5),
# SLUICE_BIN (a sluice binary to measure instead of building this tree's), PEER (envoy, or none),
# ENVOY_VERSION (the envoyproxy/ratelimit module version, pinned below), ENVOY_BIN (a built
# envoyproxy/ratelimit service to run instead of building one), ENVOY_ENV (extra environment for
# it, word-split, e.g. "REDIS_PIPELINE_WINDOW=150us").
#
# The peer: envoyproxy/ratelimit's ./src/service_cmd, fetched through the Go module proxy into the
# module cache (`go mod download`), copied to a temporary folder outside sluice's module and built
# there (none of its code enters sluice). It runs with its defaults (Redis over TCP, pool of 10,
# REDIS_PIPELINE_WINDOW 0 and REDIS_PIPELINE_LIMIT 0: radix flushes every write at once and the
# limit is unused in radix v4, no local cache), statsd off (no statsd server here), the same four
# keys as sluice's rules (one `key` entry each, no value: a counter per value) at the same limit
# per second. Each service has a redis-server of its own (started once, FLUSHALL before each run).
#
# Every round runs every configuration (W × D), sluice and the peer back to back (which goes first
# alternates), in reverse order every other round, so that a drift of the machine (the other
# tenant of a shared box, thermal, page cache) spreads over all configurations and both services
# instead of landing on the last ones. Each run gets a fresh service and an empty Redis. The
# figures are rlsload's: CPU per check is the process's utime+stime over the measured window (not
# the warm-up) divided by the checks answered; the degraded decisions and Redis's command time
# (INFO commandstats, usec summed over commands, per check) are over the whole run, warm-up
# included.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-16 64 256}
DESCS=${DESCS:-1 4}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-2s}
SERVE_FLAGS=${SERVE_FLAGS:-}
RLSLOAD_DIR=${RLSLOAD_DIR:-$repo/../shared/tools/rlsload}
GO=${GO:-go}
DENY=${DENY:-0}
DENY_FRAC=${DENY_FRAC:-0.5}
PEER=${PEER:-envoy}
ENVOY_VERSION=${ENVOY_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
ENVOY_ENV=${ENVOY_ENV:-}
DESC_KEYS=api_key,user_id,tenant_id,remote_address # the Envoy descriptor keys rlsload sends, in order

for cmd in "$GO" redis-server redis-cli curl python3 git; do
	command -v "$cmd" >/dev/null || { echo "rls.sh: $cmd not found" >&2; exit 1; }
done
[[ -f $RLSLOAD_DIR/main.go ]] || {
	echo "rls.sh: no rlsload at $RLSLOAD_DIR (set RLSLOAD_DIR to the folder of shared/tools/rlsload)" >&2
	exit 1
}
OUT=${OUT:-$(mktemp -d -t sluice-bench-rls.XXXXXX)}
mkdir -p "$OUT"
TMP=$(mktemp -d -t sluice-bench-build.XXXXXX)
read -ra serve_flags <<<"$SERVE_FLAGS"
read -ra envoy_env <<<"$ENVOY_ENV"
[[ $DENY != 1 ]] || PEER=none # the accuracy runs are sluice's alone

sluice_pid='' redis_pid='' load_pid='' peer_pid='' peer_redis_pid=''
stop_sluice() {
	# SIGTERM drains; --drain-delay 0s (below) makes that immediate.
	if [[ -n $sluice_pid ]]; then
		kill -TERM "$sluice_pid" 2>/dev/null || true
		wait "$sluice_pid" 2>/dev/null || true
		sluice_pid=
	fi
}
stop_peer() {
	if [[ -n $peer_pid ]]; then
		kill -TERM "$peer_pid" 2>/dev/null || true
		wait "$peer_pid" 2>/dev/null || true
		peer_pid=
	fi
}
cleanup() {
	if [[ -n $load_pid ]]; then kill "$load_pid" 2>/dev/null || true; fi
	stop_sluice
	stop_peer
	if [[ -n $redis_pid ]]; then kill "$redis_pid" 2>/dev/null || true; fi
	if [[ -n $peer_redis_pid ]]; then kill "$peer_redis_pid" 2>/dev/null || true; fi
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- build -------------------------------------------------------------------------------------
echo "building sluice and rlsload in $TMP" >&2
if [[ -n ${SLUICE_BIN:-} ]]; then
	cp "$SLUICE_BIN" "$TMP/sluice" # a build of another commit, to compare
else
	(cd "$repo" && "$GO" build -o "$TMP/sluice" ./cmd/sluice)
fi
(cd "$RLSLOAD_DIR" && "$GO" build -o "$TMP/rlsload" .)
peer_note=''
if [[ $PEER == envoy ]]; then
	if [[ -n ${ENVOY_BIN:-} ]]; then
		cp "$ENVOY_BIN" "$TMP/envoy-ratelimit"
		peer_note="envoyproxy/ratelimit: the binary $ENVOY_BIN"
	elif dir=$("$GO" mod download -json "github.com/envoyproxy/ratelimit@$ENVOY_VERSION" 2>"$OUT/envoy-download.log" |
		python3 -c 'import json,sys; print(json.load(sys.stdin).get("Dir", ""))') && [[ -d $dir ]]; then
		echo "building envoyproxy/ratelimit $ENVOY_VERSION from a copy of $dir" >&2
		cp -r "$dir" "$TMP/envoy-src" && chmod -R u+w "$TMP/envoy-src"
		(cd "$TMP/envoy-src" && GOFLAGS=-mod=mod "$GO" build -o "$TMP/envoy-ratelimit" ./src/service_cmd) >"$OUT/envoy-build.log" 2>&1 ||
			{ echo "rls.sh: building envoyproxy/ratelimit failed; see $OUT/envoy-build.log" >&2; exit 1; }
		peer_note="envoyproxy/ratelimit $ENVOY_VERSION (github.com/envoyproxy/ratelimit, ./src/service_cmd, built by this script)"
	else
		echo "rls.sh: the Go module proxy did not serve github.com/envoyproxy/ratelimit@$ENVOY_VERSION (see $OUT/envoy-download.log): measuring sluice alone; compare with the figures in docs/benchmarks.md" >&2
		PEER=none
	fi
fi

# --- ports and Redis ---------------------------------------------------------------------------
# Three free loopback ports, held open together so that they differ; the window between closing
# them and the servers binding them is small, and a taken port fails the run loudly.
# Seven free loopback ports (sluice's Redis, gRPC and HTTP; the peer's Redis, gRPC, HTTP and debug),
# held open together so that they differ; the window between closing them and the servers binding
# them is small, and a taken port fails the run loudly.
read -r redis_port grpc_port http_port peer_redis_port peer_grpc_port peer_http_port peer_debug_port < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(7)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in ss))')
rcli() { redis-cli -p "$redis_port" "$@"; }
start_redis() { # PORT NAME: a redis-server of its own; prints its pid
	redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
		--pidfile "$TMP/$2.pid" --dir "$TMP" --logfile "$OUT/$2.log"
	for _ in $(seq 50); do
		[[ -s $TMP/$2.pid ]] && [[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]] && break
		sleep 0.1
	done
	[[ $(redis-cli -p "$1" ping 2>/dev/null) == PONG ]] || { echo "rls.sh: redis-server did not start; see $OUT/$2.log" >&2; exit 1; }
	cat "$TMP/$2.pid"
}
redis_pid=$(start_redis "$redis_port" redis)
if [[ $PEER == envoy ]]; then peer_redis_pid=$(start_redis "$peer_redis_port" peer-redis); fi

# --- rules -------------------------------------------------------------------------------------
# One token bucket per descriptor key. sluice's names for Envoy's keys: user_id is user,
# tenant_id is tenant, remote_address is client_ip (docs/rules.md, "Model"). A descriptor of
# rlsload carries one entry, so each matches exactly one rule. LIMIT per second, burst = LIMIT;
# the default 10^9 never denies.
write_rules() { # FILE LIMIT
	cat >"$1" <<EOF
# Written by deploy/bench/rls.sh.
domain: bench
rules:
  - {id: per-api-key, match: [{key: api_key}], limit: $2, period: 1s}
  - {id: per-user, match: [{key: user}], limit: $2, period: 1s}
  - {id: per-tenant, match: [{key: tenant}], limit: $2, period: 1s}
  - {id: per-client-ip, match: [{key: client_ip}], limit: $2, period: 1s}
EOF
	"$TMP/sluice" rules validate "$1" >&2
}
write_rules "$OUT/rules.yaml" 1000000000
# The peer's configuration: the same keys and limit, Envoy's names (api_key, user_id, tenant_id,
# remote_address), in RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
write_peer_rules() { # LIMIT
	mkdir -p "$TMP/envoy-runtime/ratelimit/config"
	{
		echo "# Written by deploy/bench/rls.sh: sluice's bench rules in envoyproxy/ratelimit's format."
		echo "domain: bench"
		echo "descriptors:"
		for k in ${DESC_KEYS//,/ }; do
			printf '  - key: %s\n    rate_limit: {unit: second, requests_per_unit: %s}\n' "$k" "$1"
		done
	} >"$TMP/envoy-runtime/ratelimit/config/bench.yaml"
}
if [[ $PEER == envoy ]]; then write_peer_rules 1000000000; fi

# alive PID: running, not a zombie (a child of ours that exited stays one until waited for).
alive() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $st != Z* ]]; }
# metrics: "<degraded> <decisions>" from sluice's /metrics (decisions summed over outcome, rule).
metrics() {
	curl -fsS "http://127.0.0.1:$http_port/metrics" | awk '
		/^sluice_enforcer_degraded_decisions_total / { g += $2 }
		/^sluice_enforcer_decisions_total[{ ]/ { d += $NF }
		END { printf "%.0f %.0f\n", g, d }'
}

# run_one LABEL RULES W D: one run on a fresh sluice and an empty Redis. rlsload appends its JSON
# line to results.jsonl; what it cannot see goes, under the same label, to extra.jsonl.
run_one() {
	local label=$1 rules=$2 w=$3 d=$4 m g0 d0 g1 d1 es
	rcli flushall >/dev/null
	"$TMP/sluice" serve --redis "127.0.0.1:$redis_port" --rules "$rules" \
		--grpc "127.0.0.1:$grpc_port" --http "127.0.0.1:$http_port" --admin-http "" --drain-delay 0s \
		${serve_flags[@]+"${serve_flags[@]}"} >>"$OUT/sluice.log" 2>&1 &
	sluice_pid=$!
	for _ in $(seq 100); do
		curl -fs "http://127.0.0.1:$http_port/readyz" >/dev/null 2>&1 && break
		alive "$sluice_pid" || { echo "rls.sh: sluice exited; see $OUT/sluice.log" >&2; exit 1; }
		sleep 0.1
	done
	curl -fs "http://127.0.0.1:$http_port/readyz" >/dev/null || { echo "rls.sh: sluice not ready after 10 s" >&2; exit 1; }
	m=$(metrics) || { echo "rls.sh: no /metrics from sluice" >&2; exit 1; }
	read -r g0 d0 <<<"$m"
	rcli config resetstat >/dev/null
	"$TMP/rlsload" -addr "127.0.0.1:$grpc_port" -workers "$w" -descs "$d" -desc-keys "$DESC_KEYS" \
		-domain bench -duration "$DURATION" -warmup "$WARMUP" -pids "$sluice_pid,$redis_pid" \
		-pid-names sluice,redis -json "$OUT/results.jsonl" -label "$label" >/dev/null &
	load_pid=$!
	wait "$load_pid" # in the background so that a signal's trap runs at once, not after the run
	load_pid=
	# A sluice that died during the run fails this scrape (and so the script).
	m=$(metrics) || { echo "rls.sh: sluice died during $label; see $OUT/sluice.log" >&2; exit 1; }
	read -r g1 d1 <<<"$m"
	# cmdstat_evalsha:calls=N,usec=N,usec_per_call=X,... (absent if no script ran)
	es=$(rcli info commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2/p')
	stop_sluice
	read -r es_calls es_usec <<<"${es:-0 0}"
	printf '{"label":"%s","degraded":%d,"decisions":%d,"evalsha_calls":%d,"redis_usec":%d}\n' \
		"$label" $((g1 - g0)) $((d1 - d0)) "$es_calls" "$es_usec" >>"$OUT/extra.jsonl"
}

# run_peer LABEL W D: one run of envoyproxy/ratelimit on a fresh process and an empty Redis of its own.
run_peer() {
	local label=$1 w=$2 d=$3 us calls
	redis-cli -p "$peer_redis_port" flushall >/dev/null
	env USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$peer_redis_port" \
		RUNTIME_ROOT="$TMP/envoy-runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
		HOST=127.0.0.1 PORT="$peer_http_port" GRPC_HOST=127.0.0.1 GRPC_PORT="$peer_grpc_port" \
		DEBUG_HOST=127.0.0.1 DEBUG_PORT="$peer_debug_port" ${envoy_env[@]+"${envoy_env[@]}"} \
		"$TMP/envoy-ratelimit" >>"$OUT/envoy.log" 2>&1 &
	peer_pid=$!
	for _ in $(seq 100); do
		curl -fs "http://127.0.0.1:$peer_http_port/healthcheck" >/dev/null 2>&1 && break
		alive "$peer_pid" || { echo "rls.sh: envoyproxy/ratelimit exited; see $OUT/envoy.log" >&2; exit 1; }
		sleep 0.1
	done
	curl -fs "http://127.0.0.1:$peer_http_port/healthcheck" >/dev/null || { echo "rls.sh: envoyproxy/ratelimit not healthy after 10 s" >&2; exit 1; }
	redis-cli -p "$peer_redis_port" config resetstat >/dev/null
	"$TMP/rlsload" -addr "127.0.0.1:$peer_grpc_port" -workers "$w" -descs "$d" -desc-keys "$DESC_KEYS" \
		-domain bench -duration "$DURATION" -warmup "$WARMUP" -pids "$peer_pid,$peer_redis_pid" \
		-pid-names sluice,redis -json "$OUT/results.jsonl" -label "$label" >/dev/null &
	load_pid=$!
	wait "$load_pid"
	load_pid=
	alive "$peer_pid" || { echo "rls.sh: envoyproxy/ratelimit died during $label; see $OUT/envoy.log" >&2; exit 1; }
	# Every command's time (INCRBY, EXPIRE, ...), summed; its checks are its INCRBYs ÷ descriptors
	# (one per descriptor), warm-up included as sluice's decisions are.
	read -r calls us incrs < <(redis-cli -p "$peer_redis_port" info commandstats | tr -d '\r' |
		sed -n 's/^cmdstat_\([a-z|]*\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2 \3/p' |
		awk '{c += $2; u += $3} $1 == "incrby" {i += $2} END {printf "%d %d %d\n", c, u, i}')
	stop_peer
	printf '{"label":"%s","degraded":null,"decisions":%d,"evalsha_calls":%d,"redis_usec":%d}\n' \
		"$label" $((incrs / d)) "$calls" "$us" >>"$OUT/extra.jsonl"
}

configs=()
for w in $WORKERS; do for d in $DESCS; do configs+=("$w $d"); done; done
load_start=$(cat /proc/loadavg) started=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
# Lines already in a reused OUT are not this invocation's: the report skips them.
skip=0; [[ ! -f $OUT/results.jsonl ]] || skip=$(wc -l <"$OUT/results.jsonl")

if [[ $DENY == 1 ]]; then
	# Accuracy: per configuration, a run without limits measures the rate R; rlsload -calib-rps R
	# gives the per-key limit L (per second) at which ~DENY_FRAC of the requests of one Zipf key
	# stream exceed their key's L; a run with every rule at L then measures the deny fraction
	# (rlsload counts responses whose overall_code is OVER_LIMIT among those without error).
	for c in "${configs[@]}"; do
		read -r w d <<<"$c"
		echo "deny: w=$w d=$d: calibration run without limits" >&2
		run_one "calib w=$w d=$d" "$OUT/rules.yaml" "$w" "$d"
		rps=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["rps"])' "$OUT/results.jsonl")
		limit=$("$TMP/rlsload" -calib-rps "$rps" -deny-frac "$DENY_FRAC")
		((limit >= 1)) || limit=1 # 0 would deny everything without asking Redis
		printf 'deny: w=%s d=%s: %.0f checks/s -> %s per key per second\n' "$w" "$d" "$rps" "$limit" >&2
		write_rules "$OUT/rules-deny-w$w-d$d.yaml" "$limit"
		run_one "deny w=$w d=$d L=$limit" "$OUT/rules-deny-w$w-d$d.yaml" "$w" "$d"
	done
else
	for ((r = 1; r <= ROUNDS; r++)); do
		order=("${configs[@]}")
		if ((r % 2 == 0)); then
			order=()
			for ((i = ${#configs[@]} - 1; i >= 0; i--)); do order+=("${configs[i]}"); done
		fi
		for c in "${order[@]}"; do
			read -r w d <<<"$c"
			echo "round $r/$ROUNDS: w=$w d=$d" >&2
			if [[ $PEER == envoy && $(((r + w + d) % 2)) == 1 ]]; then
				run_peer "envoy w=$w d=$d r=$r" "$w" "$d"
				run_one "sluice w=$w d=$d r=$r" "$OUT/rules.yaml" "$w" "$d"
			else
				run_one "sluice w=$w d=$d r=$r" "$OUT/rules.yaml" "$w" "$d"
				if [[ $PEER == envoy ]]; then run_peer "envoy w=$w d=$d r=$r" "$w" "$d"; fi
			fi
		done
	done
fi
load_end=$(cat /proc/loadavg)

# --- report ------------------------------------------------------------------------------------
commit=$(git -C "$repo" rev-parse --short HEAD)
[[ -z $(git -C "$repo" status --porcelain) ]] || commit+=-dirty
echo
echo "sluice serve, Envoy RLS v3 over gRPC, one Redis ($(redis-server --version | awk '{sub("v=", "", $3); print $3}'))"
echo "- started $started; $(uname -m); nproc $(nproc); commit $commit"
echo "- load average at start: $load_start; at end: $load_end"
echo "- duration $DURATION after a warm-up of $WARMUP; rlsload defaults otherwise (10 000 keys, Zipf 1.1, 4 connections); serve flags: --drain-delay 0s ${SERVE_FLAGS:-(none)}"
if [[ $PEER == envoy ]]; then
	echo "- peer: $peer_note; its defaults (REDIS_PIPELINE_WINDOW 0, REDIS_PIPELINE_LIMIT 0, REDIS_POOL_SIZE 10), USE_STATSD false${ENVOY_ENV:+, $ENVOY_ENV}"
fi
echo
python3 - "$OUT" "$skip" "$DENY" "$DENY_FRAC" <<'PY'
import json, sys, statistics
out, skip, deny, frac = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4])
load = lambda f: [json.loads(l) for l in open(f"{out}/{f}") if l.strip()]
extra = {e["label"]: e for e in load("extra.jsonl")}  # the last line of a label is this run's
runs = [dict(r, **extra[r["label"]]) for r in load("results.jsonl")[skip:]]
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")
def us(r, name):  # rlsload's ms per 1 000 requests is µs per check
    return r["pid_cpu_ms_per_1k_req"].get(name, 0.0)
def descs(r):  # rlsload does not report -descs; the label does
    return int(r["label"].split(" d=")[1].split()[0])
groups = {}
for r in runs:
    kind = r["label"].split()[0]
    groups.setdefault((kind, r["workers"], descs(r)), []).append(r)
errs = sum(r["errors"] for r in runs)
def rus(r):  # Redis's command time per check, µs (INFO commandstats, warm-up included)
    return r["redis_usec"] / r["decisions"] if r.get("decisions") else None
def row(kind, w, d, rs):
    deg = med(r["degraded"] for r in rs) if kind == "sluice" else float("nan")
    return (f"| {w} | {d} | {kind} | {med(r['rps'] for r in rs):,.0f} | {med(r['p50_us'] for r in rs):,.0f}"
            f" | {med(r['p99_us'] for r in rs):,.0f} | {med(us(r, 'sluice') for r in rs):.1f}"
            f" | {med(us(r, 'redis') for r in rs):.1f} | {med(us(r, 'sluice') + us(r, 'redis') for r in rs):.1f}"
            f" | {'—' if deg != deg else f'{deg:.0f}'} | {med(rus(r) for r in rs):.2f} | {len(rs)} |")
if not deny:
    print("| workers | descriptors | service | checks/s | p50 µs | p99 µs | service CPU µs/check | Redis CPU µs/check"
          " | total µs/check | degraded decisions | Redis command µs/check | runs |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    cfgs = sorted({(w, d) for (_, w, d) in groups})
    for w, d in cfgs:
        for kind in ("sluice", "envoy"):
            if (kind, w, d) in groups:
                print(row(kind, w, d, groups[(kind, w, d)]))
    print("\nEach figure is the median over the runs; total = service + Redis (rlsload's own CPU is not counted);"
          "\nRedis command µs/check: INFO commandstats' usec over every command (sluice: EVALSHA) per check.")
    if any(k == "envoy" for (k, _, _) in groups):
        print("\nsluice ÷ envoyproxy/ratelimit (medians of each):\n")
        print("| workers | descriptors | total CPU | Redis CPU | service CPU | checks/s | p50 | p99 |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for w, d in cfgs:
            s_, e_ = groups.get(("sluice", w, d)), groups.get(("envoy", w, d))
            if not s_ or not e_:
                continue
            ratio = lambda f: med(f(r) for r in s_) / med(f(r) for r in e_)
            print(f"| {w} | {d} | {ratio(lambda r: us(r, 'sluice') + us(r, 'redis')):.2f}"
                  f" | {ratio(lambda r: us(r, 'redis')):.2f} | {ratio(lambda r: us(r, 'sluice')):.2f}"
                  f" | {ratio(lambda r: r['rps']):.2f} | {ratio(lambda r: r['p50_us']):.2f} | {ratio(lambda r: r['p99_us']):.2f} |")
else:
    def expect(r, limit):  # -calib-rps's model: sum_k max(0, R p_k - L) / R, p_k ~ (1+k)^-s
        ps = [(1 + k) ** -r["zipf_s"] for k in range(r["keys"])]
        rate = r["rps"] / sum(ps)
        return sum(max(0.0, rate * p - limit) for p in ps) / r["rps"]
    print("| workers | descriptors | checks/s without limits | limit per key per s | expected deny at that rate"
          " | checks/s with the limit | expected deny at that rate | measured deny | degraded decisions |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (kind, w, d), rs in sorted(groups.items()):
        if kind != "deny":
            continue
        c, r = groups[("calib", w, d)][0], rs[0]
        limit = int(r["label"].split(" L=")[1].split()[0])
        print(f"| {w} | {d} | {c['rps']:,.0f} | {limit} | {expect(c, limit):.3f} | {r['rps']:,.0f}"
              f" | {expect(r, limit):.3f} | {r['deny_frac']:.3f} | {r['degraded']} |")
    print(f"\nTarget deny fraction {frac}. Expected: rlsload -calib-rps's steady-state model (per key, the rate"
          "\nabove the limit is denied) with the integer limit, at the rate without limits (which set the"
          "\nlimit) and at the rate measured with it (denials are cheaper, so it differs). With several"
          "\ndescriptors the model is per descriptor: a check is denied when any of them is, and a denied"
          "\ncheck takes no token from the others, so the check-level fraction has no simple expectation.")
if errs:
    print(f"\nWARNING: {errs} checks failed (rlsload errors); see first_error in results.jsonl.")
PY
echo
echo "raw JSON lines: $OUT/results.jsonl (rlsload) and $OUT/extra.jsonl (degraded, Redis command time); logs: $OUT/sluice.log, $OUT/envoy.log"
