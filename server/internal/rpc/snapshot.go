package rpc

import (
	"crypto/sha256"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
)

// The Snapshot RPC: a backup of the lease state. The stream's bytes are the state machine's snapshot
// (fsm.Snapshot's envelope: magic, version, length, CRC-32C, body), taken at an applied index read
// linearizably, so a backup holds every write acknowledged before the call. It is all a restore needs
// (leasectl snapshot restore, restore.DataDir): the leases with their holders, values, tokens and request
// ids, the highest token, lock-delays and remembered lease ends.

// snapshotChunkBytes is the most data one SnapshotChunk carries (the API promises at most 1 MiB).
const snapshotChunkBytes = 1 << 20

// MaxSnapshotStreams is how many Snapshot streams one node serves at a time; more are refused with
// ResourceExhausted. Each stream holds one encoded copy of the state (about the snapshot's size) until it
// ends, so this bounds the memory backups can take (decision 14).
const MaxSnapshotStreams = 2

// snapshotLimiter counts the Snapshot streams being served. The zero value is ready.
type snapshotLimiter struct {
	mu     sync.Mutex
	active int
}

func (l *snapshotLimiter) acquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.active >= MaxSnapshotStreams {
		return false
	}
	l.active++
	return true
}

func (l *snapshotLimiter) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.active--
}

func (s *clusterService) Snapshot(_ *leasepb.SnapshotRequest, stream grpc.ServerStreamingServer[leasepb.SnapshotChunk]) error {
	if !s.snapshots.acquire() {
		return withDetails(codes.ResourceExhausted, errSnapshotStreams, &errdetails.QuotaFailure{
			Violations: []*errdetails.QuotaFailure_Violation{{Subject: "snapshot streams", Description: errSnapshotStreams.Error()}}})
	}
	defer s.snapshots.release()
	data, index, err := s.o.consistentSnapshot(stream.Context())
	if err != nil {
		return s.o.Status(err)
	}
	return sendWatched(stream, data, index, snapshotStall)
}

// snapshotStall is how long a Snapshot stream may go without the client taking a chunk before the
// stream is ended (DeadlineExceeded), so a reader that stopped reading cannot hold one of the
// MaxSnapshotStreams slots, and a copy of the state, for ever. A var for tests.
var snapshotStall = 30 * time.Second

// SetSnapshotStall sets how long a Snapshot stream may take no chunk (for tests); the returned func
// restores it.
func SetSnapshotStall(d time.Duration) (restore func()) {
	old := snapshotStall
	snapshotStall = d
	return func() { snapshotStall = old }
}

// sendWatched is sendSnapshot under a watchdog: it ends the stream once no chunk has been taken for
// stall. gRPC's Send has no deadline of its own and blocks while the client's flow-control window is
// full, so the sending runs on a goroutine of this RPC; returning ends the RPC, whose context then
// releases the blocked Send and the goroutine with it.
func sendWatched(stream grpc.ServerStreamingServer[leasepb.SnapshotChunk], data []byte, index uint64, stall time.Duration) error {
	var sent atomic.Int64 // chunks the client has taken
	done := make(chan error, 1)
	go func() { done <- sendSnapshot(stream, data, index, func() { sent.Add(1) }) }()
	tick := time.NewTicker(stall)
	defer tick.Stop()
	last := int64(-1)
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if n := sent.Load(); n != last {
				last = n
				continue
			}
			return status.Errorf(codes.DeadlineExceeded, "the snapshot stream took no chunk for %v: ending it", stall)
		}
	}
}

var errSnapshotStreams = errors.New("this node already serves the most concurrent snapshot streams; retry later")

// sendSnapshot streams data in chunks of at most snapshotChunkBytes; the last one carries the sha256.
// The chunks alias data: nothing more is allocated per chunk.
func sendSnapshot(stream grpc.ServerStreamingServer[leasepb.SnapshotChunk], data []byte, index uint64, taken func()) error {
	sum := sha256.Sum256(data)
	for off := 0; ; off += snapshotChunkBytes {
		end := min(off+snapshotChunkBytes, len(data))
		chunk := &leasepb.SnapshotChunk{Data: data[off:end], RemainingBytes: uint64(len(data) - end), AppliedIndex: index}
		if end == len(data) {
			chunk.Sha256 = sum[:]
		}
		if err := stream.Send(chunk); err != nil {
			return err
		}
		taken()
		if end == len(data) {
			return nil
		}
	}
}
