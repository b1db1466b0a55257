package rpc

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
func watchMessageBytes(l Limits) int {
	return max(min(maxClientMessage, l.MaxRequestBytes)-watchMessageHeadroom, 1)
}
