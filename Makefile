# leased — developer entry points. `make help` lists them.
SHELL := /bin/bash
GO ?= go
FUZZTIME ?= 60s

.PHONY: help test test-short proto proto-check build cluster bench bench-bins bench-compare bench-compare-smoke fuzz vet fmt clean chaos chaos-plants

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: ## the whole test suite (race detector on); starts PostgreSQL, MariaDB and Redis for the adapter tests
	./scripts/test.sh

test-short: ## the inner loop: every package's unit tests, no cluster started, no race detector (under 90 s warm)
	$(GO) test -short -count=1 ./...

proto: ## regenerate api/leasepb and api/wirepb from api/proto (pinned buf and plugins, fetched as Go modules)
	./scripts/proto.sh

proto-check: ## lint the protos, check the generated code is current, buf breaking of the public API vs the latest release tag
	./scripts/proto.sh check

# VERSION overrides the version the binaries report (-ldflags -X); left empty, they report what the Go
# build information records, as go install and the Dockerfile do (see cmd/internal/buildinfo).
VERSION ?=
LDFLAGS := $(if $(VERSION),-X github.com/leased/leased/cmd/internal/buildinfo.version=$(VERSION))

build: ## build leased and leasectl into ./bin ([VERSION=v1.2.3] overrides the recorded version)
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/ ./cmd/...

cluster: ## build leased into ./bin and run a local 3-node cluster in the foreground (data in ./data; Ctrl-C stops it)
	GO=$(GO) ./scripts/cluster.sh

bench: ## run the Go benchmarks, as docs/benchmarks.md reports them
	$(GO) test -run='^$$' -bench='BenchmarkApply(Entry)?Acquire$$' -cpu 1 -benchtime 1000000x ./fsm/
	$(GO) test -run='^$$' -bench='ApplyExpire|ApplyCheckpoint' -benchtime 5x ./fsm/
	$(GO) test -run='^$$' -bench='Memory|Snapshot|Restore' -benchtime 1x ./fsm/
	$(GO) test -run='^$$' -bench=. -benchtime 2s ./raftlog/
	$(GO) test -run='^$$' -bench=. -benchtime 3s ./server/transport/
	$(GO) test -run='^$$' -bench='Acquire|Renew' -benchtime 3000x ./server/
	$(GO) test -run='^$$' -bench='MassExpiry|MassCheckpoint' -benchtime 1x -timeout 20m ./server/
	$(GO) test -run='^$$' -bench='CheckpointScan|CheckpointEntries' -benchtime 1x ./server/internal/lessor/
	$(GO) test -run='^$$' -bench='MemoryHeld|RestartReady' -benchtime 1x -timeout 30m ./server/
	$(GO) test -run='^$$' -bench=KeepAlive10k -benchtime 1x ./client/

# bench-compare: leased against etcd and ZooKeeper, side by side (docs/benchmarks.md). bench/ is its own Go
# module (etcd and the ZooKeeper client stay out of go.mod); it builds etcd from the module proxy and leased
# from this tree into bench/bin, and bench/zookeeper.sh installs Debian's zookeeper and default-jre when
# missing (as root). BENCH_FLAGS passes flags to it (bench/main.go: --systems, --rows, --duration, --reps,
# --clients, --leases, ...).
BENCH_FLAGS ?=
bench-bins:
	./bench/zookeeper.sh
	cd bench && $(GO) build -o bin/etcd go.etcd.io/etcd/server/v3 && $(GO) build -o bin/bench .
	$(GO) build -ldflags "$(LDFLAGS)" -o bench/bin/leased ./cmd/leased

bench-compare: bench-bins ## leased vs etcd v3.7.3 and ZooKeeper 3.8, one markdown table (slow: 1M held leases; BENCH_FLAGS=--rows=acquire)
	cd bench && ./bin/bench $(BENCH_FLAGS)

bench-compare-smoke: bench-bins ## every row of bench-compare with tiny sizes (a minute or two): proves it works, measures nothing
	cd bench && ./bin/bench --reps=1 --duration=1s --clients=1,16 --renew-clients=1,4 --kills=1 --leases=2000 \
		--rows=acquire,contended,renew,read,batched,steady,failover,memory --batch-leases=2000 --steady=2s --steady-clients=4 $(BENCH_FLAGS)

fuzz: ## run every fuzz target for FUZZTIME each
	./scripts/fuzz.sh $(FUZZTIME)

SEED ?= $(shell date +%s)
DURATION ?= 30m
CHAOS_OUT ?= /tmp/leased-chaos
NODES ?= 3
GRAY ?=
STRICT ?=
PLANT ?=
TLS ?=
MEMBERSHIP ?=
FLOOD ?=
PEERFORGE ?=
DISK ?=
WIPE ?=
DISKERR ?=
chaos: ## fault-injection soak: make chaos SEED=42 DURATION=30m [NODES=5] [GRAY=1] [STRICT=1] [TLS=1] [MEMBERSHIP=1] [FLOOD=1] [DISK=1] [WIPE=1] [PEERFORGE=1] [DISKERR=1] [PLANT=gray-sdk,release-lost-answer] [LOG_LEVEL=debug]
	mkdir -p $(CHAOS_OUT)
	LEASED_CHAOS_SEED=$(SEED) LEASED_CHAOS_DURATION=$(DURATION) LEASED_CHAOS_OUT=$(CHAOS_OUT) LEASED_CHAOS_NODES=$(NODES) \
		LEASED_CHAOS_GRAY=$(GRAY) LEASED_CHAOS_STRICT=$(STRICT) LEASED_CHAOS_PLANT=$(PLANT) LEASED_CHAOS_TLS=$(TLS) \
		LEASED_CHAOS_MEMBERSHIP=$(MEMBERSHIP) LEASED_CHAOS_FLOOD=$(FLOOD) LEASED_CHAOS_LOG_LEVEL=$(LOG_LEVEL) \
		LEASED_CHAOS_DISK=$(DISK) LEASED_CHAOS_WIPE=$(WIPE) LEASED_CHAOS_PEERFORGE=$(PEERFORGE) LEASED_CHAOS_DISKERR=$(DISKERR) \
		$(GO) test -run '^TestChaos$$' -count=1 -timeout=0 -v ./tests/chaos/

chaos-plants: ## the planted-bug runs of the chaos checkers (server plantbug build, gray-sdk, release-lost-answer)
	$(GO) test -run '^(TestCheckersCatchPlantedReleaseBug|TestL1CatchesPlantedGraySDK|TestLogCheckerCatchesPlantedReleaseRetry)$$' -count=1 -v ./tests/chaos/

vet: ## go vet
	$(GO) vet ./...

fmt: ## gofmt the tree
	gofmt -w $$(git ls-files '*.go' | grep -v '\.pb\.go$$')

clean: ## remove build output and local cluster data
	rm -rf bin data
