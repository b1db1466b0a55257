// Package wirepb holds the generated Go code for leased's internal wire formats (protobuf package
// leased.internal.v1): the peer-to-peer Raft service (raft message batches and requests a follower forwards
// to the leader) and the state machine's log commands and snapshot body.
//
// It is not a public API: only leased nodes speak it, and it may change between releases (within the rules
// that keep a mixed-version cluster safe, see docs/design.md, "Upgrades"). Programs use api/leasepb.
//
// The sources are api/proto/leased/internal/v1/*.proto. Do not edit the generated files: change the .proto
// files and run `make proto`.
package wirepb
