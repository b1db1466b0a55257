#!/usr/bin/env bash
# proto.sh — the protobuf code, with pinned tools fetched from the Go module proxy (no protoc needed).
#
#   scripts/proto.sh          lint api/proto and regenerate api/leasepb and api/wirepb, the HTTP/JSON gateway
#                             (api/leasepb/*.pb.gw.go) and api/openapi/leased.swagger.json (what `make proto` runs)
#   scripts/proto.sh check    lint, fail if the committed generated code is not what the sources generate,
#                             and run `buf breaking` on the public leased.v1 package against the latest
#                             release tag, if any (what `make proto-check` and scripts/test.sh run)
#
# The internal package (api/proto/leased/internal/v1: raft transport, FSM commands, snapshots) is exempt
# from the breaking check: it is not an API. Its compatibility rules are in docs/design.md, "Upgrades".
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=v1.75.0
buf() { go run "github.com/bufbuild/buf/cmd/buf@${BUF_VERSION}" "$@"; }

# generate [DIR]: every generated file, into DIR (default: the tree). buf.gen.yaml makes the Go code,
# buf.gen.openapi.yaml the OpenAPI file of the public Leases service alone.
generate() {
	local out=(${1:+-o "$1"})
	buf generate "${out[@]}"
	buf generate --template buf.gen.openapi.yaml "${out[@]}"
}

# generated lists the generated files under api/ of a tree (relative paths, sorted).
generated() {
	(cd "$1" && find api -name '*.pb.go' -o -name '*.pb.gw.go' -o -name '*.swagger.json' | sort)
}


case "${1:-generate}" in
generate)
	buf lint
	generate
	;;
check)
	echo "== buf lint"
	buf lint
	echo "== generated code is up to date"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	generate "$tmp"
	stale=0
	for f in $(generated "$tmp"); do
		if ! cmp -s "$tmp/$f" "$f"; then
			echo "proto.sh: $f differs from what api/proto generates; run 'make proto' and commit the result" >&2
			stale=1
		fi
	done
	for f in $(git ls-files 'api/*.pb.go' 'api/*.pb.gw.go' 'api/*.swagger.json'); do
		if [[ ! -f "$tmp/$f" ]]; then
			echo "proto.sh: $f is committed but no longer generated; remove it" >&2
			stale=1
		fi
	done
	[[ $stale -eq 0 ]]
	# Compatibility is promised between tagged releases only (docs/design.md, "Upgrades"): the public API
	# must not break against the latest release tag; before the first tag there is nothing to keep.
	tag=$(git describe --tags --abbrev=0 2>/dev/null || true)
	if [[ -n "$tag" ]] && git cat-file -e "$tag:api/proto" 2>/dev/null; then
		echo "== buf breaking (public API) against the latest release, $tag"
		buf breaking --against ".git#tag=$tag"
	else
		echo "== buf breaking: no release tag yet (compatibility is promised between tagged releases only); skipped"
	fi
	;;
*)
	echo "usage: scripts/proto.sh [generate|check]" >&2
	exit 2
	;;
esac
