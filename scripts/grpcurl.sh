#!/usr/bin/env bash
# grpcurl.sh — print the path of a pinned grpcurl, for the docs' grpcurl examples (tests/e2e,
# TestDocExamplesRun). The first run builds it from the Go module proxy (go install, a minute or two)
# into ${XDG_CACHE_HOME:-~/.cache}/leased/; later runs find it there. scripts/test.sh exports the path as
# LEASED_TEST_GRPCURL. Exits non-zero, saying why, when it cannot be built.
set -euo pipefail

readonly VERSION=v1.9.4 # keep in step with grpcurlVersion in tests/e2e/docs_cli_test.go
dir=${XDG_CACHE_HOME:-$HOME/.cache}/leased/grpcurl-$VERSION
if [[ ! -x $dir/grpcurl ]]; then
	echo "grpcurl.sh: building grpcurl $VERSION into $dir" >&2
	mkdir -p "$dir"
	(cd "$dir" && GOBIN=$dir GOFLAGS= go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$VERSION") >&2
fi
echo "$dir/grpcurl"
