# leased and leasectl in a small image. Build: docker build -t leased:local .
# tests/deploy (TestContainerImage) builds it and runs compose.yaml with it on a real Docker engine.
#
# The base images are build arguments: BUILD_IMAGE needs a shell, mkdir and a Go toolchain on PATH;
# RUNTIME_IMAGE needs nothing (leased is static), though distroless brings CA certificates and time zones.
# The binaries report the version the Go build information records (a checkout of tag v1.2.3 reports
# v1.2.3, as go install and make build do); --build-arg VERSION=... overrides it, as make VERSION=... does.
ARG BUILD_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w ${VERSION:+-X github.com/leased/leased/cmd/internal/buildinfo.version=${VERSION}}" \
      -o /out/ ./cmd/leased ./cmd/leasectl \
 && mkdir -p /out/data

FROM ${RUNTIME_IMAGE}
COPY --from=build /src/LICENSE /usr/share/doc/leased/LICENSE
COPY --from=build /out/leased /out/leasectl /usr/local/bin/
# An empty /data owned by the nonroot user, so a fresh named volume is writable by it.
COPY --from=build --chown=65532:65532 /out/data /data
# Clients 7101, peers 7201, admin HTTP (/healthz, /readyz, /metrics) 7401, the HTTP/JSON API 7501
# (docs/http.md). Every flag is also an env var (LEASED_NAME, LEASED_DATA_DIR, LEASED_INITIAL_CLUSTER,
# ...); see docs/operations.md.
EXPOSE 7101 7201 7401 7501
VOLUME ["/data"]
# The nonroot user of distroless, set here so that another RUNTIME_IMAGE runs leased as it too.
USER 65532:65532
# NO TLS BY DEFAULT. With these defaults a node refuses to start: its peer port would be plaintext on a
# non-loopback address. Mount certificates and set LEASED_CERT_FILE, LEASED_KEY_FILE,
# LEASED_TRUSTED_CA_FILE, LEASED_CLIENT_CERT_AUTH=true and LEASED_PEER_CERT_FILE, LEASED_PEER_KEY_FILE,
# LEASED_PEER_TRUSTED_CA_FILE — or set LEASED_INSECURE_PEER=true on a network you trust, knowing that
# anyone who reaches the ports can then forge raft traffic and do anything as a client
# (docs/security.md, "Containers"). The admin port has no authentication: do not publish it widely.
ENV LEASED_DATA_DIR=/data \
    LEASED_CLIENT_ADDR=0.0.0.0:7101 \
    LEASED_PEER_ADDR=0.0.0.0:7201 \
    LEASED_ADMIN_ADDR=0.0.0.0:7401 \
    LEASED_HTTP_ADDR=0.0.0.0:7501
# The image has no shell or curl: leased itself asks its admin port's /readyz (LEASED_ADMIN_ADDR, with
# 0.0.0.0 asked on loopback) and exits 0 when the node knows a leader.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 CMD ["/usr/local/bin/leased", "health"]
ENTRYPOINT ["/usr/local/bin/leased"]
