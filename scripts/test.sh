#!/usr/bin/env bash
# test.sh — the project's test suite, as the README and .ci/run run it.
#
# Runs `go vet` and every package's tests with the race detector, beside throwaway PostgreSQL and Redis
# servers that scripts/services.sh starts (and, as root on Debian, installs) for the fence adapter tests.
# Arguments replace the default `./...`, e.g. `scripts/test.sh -run Fence ./client/...`.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -eq 0 ]]; then
	set -- ./...
fi
echo "== go vet ./..."
go vet ./...
echo "== go test -race $*"
exec ./scripts/services.sh go test -race -timeout 25m -count=1 "$@"
