#!/usr/bin/env bash
# Builds sluice's OCI image from the Dockerfile with buildah (`buildah bud`: no
# daemon, no registry needed) and prints its size.
#
#   deploy/image/build.sh                 # or: make image
#   IMAGE=localhost/sluice:dev GO_IMAGE=docker.io/library/golang:1.26-bookworm deploy/image/build.sh
#
# Environment: IMAGE (the tag, default ghcr.io/sluice-rl/sluice:dev), VERSION and COMMIT (what
# `sluice version` prints), GO_IMAGE (the build stage's base). Without GO_IMAGE the script builds
# localhost/sluice-go:<go version> from this machine's own Go toolchain (`go env GOROOT`), CA
# bundle and /bin/dash (as /bin/sh, with the libraries it loads), once, so that no registry is needed; the build stage downloads modules from GOPROXY
# (the host's network). BUILDAH_FLAGS adds flags to `buildah bud` (word-split).
#
# On machines whose cgroups are a v1/v2 hybrid, crun (Debian's default OCI runtime) refuses to
# run the build's RUN steps; the script then uses runc when it is installed. Container limits
# are set to the caller's own open files and 4096 processes (at most the caller's), which an
# unprivileged sandbox may not raise.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${IMAGE:-ghcr.io/sluice-rl/sluice:dev}
VERSION=${VERSION:-dev}
COMMIT=${COMMIT:-$(git -C "$repo" rev-parse HEAD 2>/dev/null || true)}
GO=${GO:-go}
command -v buildah >/dev/null || { echo "build.sh: buildah not found (Debian: apt-get install buildah)" >&2; exit 1; }

nproc=$(ulimit -Hu)
[[ $nproc == unlimited || $nproc -gt 4096 ]] && nproc=4096
flags=(--network host --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$nproc:$nproc")
if [[ -d /sys/fs/cgroup/unified ]] && command -v runc >/dev/null; then
	flags+=(--runtime "$(command -v runc)")
fi
read -ra extra <<<"${BUILDAH_FLAGS:-}"

if [[ -z ${GO_IMAGE:-} ]]; then
	goversion=$("$GO" env GOVERSION)
	GO_IMAGE=localhost/sluice-go:$goversion
	if ! buildah inspect --type image "$GO_IMAGE" >/dev/null 2>&1; then
		echo "build.sh: building $GO_IMAGE from $("$GO" env GOROOT)"
		ctr=$(buildah from scratch)
		trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
		buildah copy --quiet "$ctr" "$("$GO" env GOROOT)" /usr/local/go >/dev/null
		buildah copy --quiet "$ctr" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt >/dev/null
		# A shell for the Dockerfile's RUN steps: the host's dash and the libraries it loads.
		buildah copy --quiet "$ctr" "$(readlink -f /bin/dash)" /bin/sh >/dev/null
		for lib in $(ldd /bin/dash | grep -o '/[^ ]*'); do
			buildah copy --quiet "$ctr" "$(readlink -f "$lib")" "$lib" >/dev/null
		done
		tmp=$(mktemp -d)
		buildah copy --quiet --chmod 1777 "$ctr" "$tmp" /tmp >/dev/null
		rmdir "$tmp"
		buildah config --env PATH=/usr/local/go/bin --env GOTOOLCHAIN=local --env HOME=/tmp \
			--env GOPROXY="$("$GO" env GOPROXY)" --env GOSUMDB="$("$GO" env GOSUMDB)" "$ctr"
		buildah commit --quiet "$ctr" "$GO_IMAGE" >/dev/null
	fi
fi

buildah bud "${flags[@]}" "${extra[@]}" --layers \
	--build-arg GO_IMAGE="$GO_IMAGE" --build-arg VERSION="$VERSION" --build-arg COMMIT="$COMMIT" \
	-t "$IMAGE" -f "$repo/Dockerfile" "$repo"
echo "build.sh: $IMAGE built; $(buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$IMAGE" | head -1)"
