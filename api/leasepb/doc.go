// Package leasepb holds the generated Go code for leased's public v1 API (protobuf package leased.v1): the
// client-facing Leases service and the operator-facing Cluster service, with their messages and error
// details. It is the API programs in any language use; it changes only compatibly (`make proto-check` runs
// `buf breaking` against the previous commit).
//
// The sources are api/proto/leased/v1/*.proto; every field and every limit is documented there. Do not edit
// the generated files: change the .proto files and run `make proto`, which uses pinned versions of buf,
// protoc-gen-go and protoc-gen-go-grpc fetched from the Go module proxy.
//
// The formats only nodes exchange (raft traffic, forwarded requests, log commands, snapshots) are not here:
// they live in api/wirepb, which is free to change between releases.
package leasepb
