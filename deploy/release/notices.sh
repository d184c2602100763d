#!/usr/bin/env bash
# Writes the licence and notice files of every module linked into sluice's binary (go list -deps
# over ./cmd/sluice, with TAGS as its build tags) to standard output, one section per module,
# for the release artifacts and the image: Apache-2.0 §4 and the BSD and MIT licences ask that
# they go with redistributed binaries.
#
#   deploy/release/notices.sh > dist/THIRD_PARTY_NOTICES          # TAGS=nocharts for the sidecar's
set -euo pipefail
export LC_ALL=C # one order on every machine: the file is checked in
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GO=${GO:-go}
cd "$repo"
echo "Licences and notices of the modules linked into sluice (go list -deps ./cmd/sluice${TAGS:+ -tags $TAGS})."
# Modules whose code sluice carries ported rather than links: Coraza's CRS transformations and its
# best-fit table for %u escapes (detector/crstransform.go). Listed whether or not a build links them.
ported=(github.com/corazawaf/coraza/v3)
{
	"$GO" list -deps -tags "${TAGS:-}" -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}' ./cmd/sluice
	for m in "${ported[@]}"; do "$GO" list -m -f '{{.Path}} {{.Version}} {{.Dir}}' "$m"; done
} | sort -u | while read -r path ver dir; do
	files=$(find "$dir" -maxdepth 1 -type f \( -iname 'LICEN[CS]E*' -o -iname 'NOTICE*' -o -iname 'COPYING*' \) | sort)
	if [[ -z $files ]]; then
		echo "notices.sh: $path $ver has no licence file at its root" >&2
		exit 1
	fi
	for f in $files; do
		printf '\n==== %s %s: %s ====\n\n' "$path" "$ver" "$(basename "$f")"
		cat "$f"
	done
done
