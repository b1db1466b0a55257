#!/usr/bin/env bash
# test.sh — the project's test suite, as the README and .ci/run run it.
#
# Runs `go vet` and every package's tests with the race detector, beside throwaway PostgreSQL, MariaDB,
# Redis and one-node Redis Cluster servers that scripts/services.sh starts (and, as root on Debian,
# installs) for the fence adapter tests.
# The default run (no arguments) also checks the protobuf sources and generated code (scripts/proto.sh check:
# lint, stale generated code, buf breaking of the public API) and the Prometheus alerting rules
# (scripts/promtool.sh: promtool check rules and the rules' unit tests; as root it installs Debian's
# prometheus package for promtool), and decodes deploy/kubernetes against the Kubernetes API types
# (tests/deploy/kubeapi, a module of its own), and runs bench/'s tests (a module of its own too), whose
# ZooKeeper smoke test needs Debian's zookeeper and default-jre (bench/zookeeper.sh installs them as root;
# under CI=true their absence fails the run). A run of ./... or ./tests/e2e builds a pinned grpcurl for the
# docs' examples (scripts/grpcurl.sh, once). Every run has a Docker engine beside it for the container
# test (scripts/docker.sh: as root it installs Debian's docker.io and docker-compose and starts dockerd).
# Arguments replace the default `./...`, e.g. `scripts/test.sh -run Fence ./client/...`, and skip those
# checks.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -eq 0 ]]; then
	echo "== scripts/proto.sh check"
	./scripts/proto.sh check
	echo "== scripts/promtool.sh"
	./scripts/promtool.sh
	echo "== bench (the comparison's own tests; a ZooKeeper ensemble, which bench/zookeeper.sh installs as root)"
	./bench/zookeeper.sh
	(cd bench && go vet ./... && go test -race -count=1 ./...)
	echo "== cmd/leased with -tags faultinject (the chaos harness's fault hooks)"
	go vet -tags faultinject ./cmd/leased/ && go test -race -count=1 -tags faultinject -run 'Hook|Injected' ./cmd/leased/
	echo "== tests/deploy/kubeapi"
	(cd tests/deploy/kubeapi && go vet ./... && go test -count=1 ./...)
	set -- ./...
fi
# The docs' grpcurl examples (tests/e2e) need grpcurl: without it they skip, or fail under CI=true.
if [[ -z ${LEASED_TEST_GRPCURL:-} && " $* " =~ \ (\./\.\.\.|\./tests/e2e/?(\.\.\.)?)\  ]]; then
	if LEASED_TEST_GRPCURL=$(./scripts/grpcurl.sh); then
		export LEASED_TEST_GRPCURL
	else
		printf '\n!!! test.sh WARNING: grpcurl could not be built: the docs'"'"' grpcurl examples will not run\n\n' >&2
	fi
fi
echo "== go vet ./..."
go vet ./...
echo "== go test -race $*"
exec ./scripts/docker.sh ./scripts/services.sh go test -race -timeout 25m -count=1 "$@"
