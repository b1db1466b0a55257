// Package leasepb holds the generated Go code for leased's v1 wire API: the client-facing Leases service,
// the operator-facing Cluster service, the peer-to-peer Raft service, and the state machine's log commands
// and snapshot body.
//
// The sources are api/proto/leased/v1/*.proto; every field and every limit is documented there. Do not edit
// the generated files: change the .proto files and run `make proto`, which uses pinned versions of buf,
// protoc-gen-go and protoc-gen-go-grpc fetched from the Go module proxy.
package leasepb
