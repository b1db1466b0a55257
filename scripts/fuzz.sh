#!/usr/bin/env bash
# fuzz.sh DURATION — runs every fuzz target of the tree for DURATION each (default 60s).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-60s}"
for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	for target in $(grep -hoE '^func (Fuzz[A-Za-z0-9_]+)' "$dir"/*_test.go 2>/dev/null | awk '{print $2}'); do
		echo "== $pkg $target ($fuzztime)"
		go test -run='^$' -fuzz="^${target}\$" -fuzztime="$fuzztime" "$pkg"
	done
done
