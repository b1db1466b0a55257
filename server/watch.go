package server

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
)

// maxClientMessage is the largest message a gRPC client accepts by default: the Watch stream's messages
// stay below it (with headroom) whatever the node's own limits, so a client with default options can read
// them.
const maxClientMessage = 4 << 20

// watchRoundBytes bounds the events one Watch round reads and sends, so that a watcher blocked sending
// to a client that stopped reading pins little memory (the rest waits in the shared history).
const watchRoundBytes = 256 << 10

// watchMessageHeadroom is room left in a Watch message for its header and framing.
const watchMessageHeadroom = 64 << 10

// watchMessageBytes is the most bytes of events one Watch message carries: the smaller of the client's
// default receive limit and the node's own request limit, less headroom.
func (c Config) watchMessageBytes() int {
	return max(min(maxClientMessage, c.Limits.MaxRequestBytes)-watchMessageHeadroom, 1)
}

// watchResponses splits events into Watch messages of at most limit bytes of events each (docs/design.md,
// "Watch"): one entry's events — an expiry batch of many leases with large values — may span several
// messages. A single event larger than limit travels alone.
func (n *node) watchResponses(events []fsm.Event, limit int) []*leasepb.WatchResponse {
	var (
		out  []*leasepb.WatchResponse
		cur  *leasepb.WatchResponse
		size int
	)
	for _, e := range events {
		pe := e.Proto()
		sz := protowire.SizeBytes(proto.Size(pe)) + 1 // the events field: tag, length, event
		if cur == nil || size+sz > limit && len(cur.Events) > 0 {
			cur, size = &leasepb.WatchResponse{Header: n.ops.header()}, 0
			out = append(out, cur)
		}
		cur.Events = append(cur.Events, pe)
		size += sz
	}
	return out
}
