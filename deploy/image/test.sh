#!/usr/bin/env bash
# Runs sluice's image with podman: `sluice serve` in the container, against a redis-server on the
# host's loopback, must answer /readyz and decide a /v1/check (allowed, then denied once the
# example rule's limit is spent), and `sluice version` must print the image's version. The image is
# inspected first: entrypoint, a non-root user, its size.
#
#   IMAGE=ghcr.io/sluice-rl/sluice:v0.1.0 deploy/image/test.sh      # or: make image-test
#
# Where the kernel or sandbox refuses to run containers (podman run fails before sluice starts),
# it says so, prints podman's error, and exits 0 after the inspection, or 1 with REQUIRE_RUN=1.
set -euo pipefail
IMAGE=${IMAGE:?IMAGE names the image to test}
for cmd in podman redis-server redis-cli curl; do
	command -v "$cmd" >/dev/null || { echo "test.sh: $cmd not found" >&2; exit 1; }
done

fail() { echo "test.sh: FAIL: $*" >&2; exit 1; }

# The image: what a kubelet would run.
entry=$(podman image inspect --format '{{json .Config.Entrypoint}} {{json .Config.Cmd}}' "$IMAGE")
user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "test.sh: $IMAGE: entrypoint $entry, user $user, $((size / 1000000)) MB"
[[ $entry == '["/usr/local/bin/sluice"] ["serve"]' ]] || fail "entrypoint and command: $entry"
[[ -n $user && ${user%%:*} != 0 && ${user%%:*} != root ]] || fail "the image runs as root (user '$user')"
licence=$(podman image inspect --format '{{index .Config.Labels "org.opencontainers.image.licenses"}}' "$IMAGE")
[[ $licence == Apache-2.0 ]] || fail "label org.opencontainers.image.licenses is '$licence'"
# The licence and the third-party notices ship inside (read from a created, never started, container).
probe=$(podman create "$IMAGE")
for f in LICENSE THIRD_PARTY_NOTICES; do
	podman cp "$probe:/usr/share/doc/sluice/$f" - >/dev/null 2>&1 || { podman rm "$probe" >/dev/null; fail "no /usr/share/doc/sluice/$f in the image"; }
done
podman rm "$probe" >/dev/null
echo "test.sh: labels and /usr/share/doc/sluice/{LICENSE,THIRD_PARTY_NOTICES} present"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport=$(free_port) hport=$(free_port) gport=$(free_port) aport=$(free_port)
name=sluice-image-test-$$
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >/dev/null &
redis_pid=$!
cleanup() {
	podman rm -f "$name" >/dev/null 2>&1 || true
	kill "$redis_pid" 2>/dev/null || true
}
trap cleanup EXIT

# crun refuses cgroup v1/v2 hybrids; runc runs there. Limits: the caller's, which a sandbox
# may not raise (see build.sh).
run_flags=(--network host --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=1024:1024")
if [[ -d /sys/fs/cgroup/unified ]] && command -v runc >/dev/null; then
	run_flags=(--runtime "$(command -v runc)" "${run_flags[@]}")
fi

if ! out=$(podman run --rm "${run_flags[@]}" "$IMAGE" version 2>&1); then
	echo "test.sh: this machine cannot run containers (podman run failed); the image was built and inspected only:" >&2
	echo "$out" >&2
	[[ ${REQUIRE_RUN:-0} == 1 ]] && exit 1
	exit 0
fi
echo "$out"
[[ $out == "sluice "* ]] || fail "sluice version printed: $out"

for i in $(seq 50); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
podman run -d --name "$name" "${run_flags[@]}" "$IMAGE" serve --redis "127.0.0.1:$rport" \
	--http "127.0.0.1:$hport" --grpc "127.0.0.1:$gport" --admin-http "127.0.0.1:$aport" >/dev/null
ready=
for i in $(seq 100); do
	if curl -fsS "127.0.0.1:$aport/readyz" >/dev/null 2>&1; then ready=1; break; fi
	sleep 0.2
done
[[ -n $ready ]] || { podman logs "$name" >&2 || true; fail "/readyz did not answer 200 within 20 s"; }
echo "test.sh: /readyz answered 200"

# The example rules (enforcer/sidecar/example-rules.yaml) give each remote_address a token bucket
# of 20, refilled at 10 a second: a check of 20 hits takes them all, the next one is denied.
body='{"domain":"sluice","hits_addend":20,"descriptors":[{"entries":[{"key":"remote_address","value":"192.0.2.1"}]}]}'
codes=()
for i in 1 2; do
	codes+=("$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$hport/v1/check" -d "$body")")
done
echo "test.sh: /v1/check answered ${codes[*]}"
[[ ${codes[*]} == "200 429" ]] || fail "want 200 then 429, got ${codes[*]}"
keys=$(redis-cli -p "$rport" dbsize)
[[ $keys -ge 1 ]] || fail "the container's decisions left nothing in the host's Redis"
echo "test.sh: ok: the container decided on the host's Redis ($keys keys)"
