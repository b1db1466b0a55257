package server_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/fsm"
	"github.com/leased/leased/server"
)

// TestWatchSplitsALargeExpiryBatch: one expiry entry of 64 leases with 100 KiB values (6.4 MiB of
// events) reaches a watcher with default gRPC options intact, in several messages each under the 4 MiB
// a client accepts. Sent as one message, the client refuses it (ResourceExhausted: message larger than
// max) and the watch ends.
func TestWatchSplitsALargeExpiryBatch(t *testing.T) {
	const (
		leases     = 64
		valueBytes = 100 << 10
		index      = 1000
	)
	cfg := server.TestConfig()
	cfg.Limits.MaxValueBytes = valueBytes
	s := startSingleNode(t, &cfg)

	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	stream, err := dial(t, cfg.ClientAddr).Watch(ctx, &leasepb.WatchRequest{Prefix: "big/"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the watch to be served", func() bool { return s.Watchers() == 1 })
	value := func(k int) []byte { return bytes.Repeat([]byte{byte('a' + k%26)}, valueBytes) }
	events := make([]fsm.Event, leases)
	for k := range events {
		events[k] = fsm.Event{Type: leasepb.EventType_EVENT_TYPE_EXPIRED, Index: index, Lease: fsm.Lease{
			Resource: fmt.Sprintf("big/%02d", k), Holder: "h", Token: uint64(k + 1), TTLMs: 1000, Value: value(k)}}
	}
	s.PublishEvents(index, events)

	var got []*leasepb.Event
	messages := 0
	for len(got) < leases {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("after %d events in %d messages: %v", len(got), messages, err)
		}
		messages++
		if size := proto.Size(resp); size >= 4<<20 {
			t.Fatalf("message %d is %d bytes, over the 4 MiB a client accepts", messages, size)
		}
		got = append(got, resp.GetEvents()...)
	}
	if messages < 2 {
		t.Fatalf("6.4 MiB of events arrived in %d message", messages)
	}
	for k, e := range got {
		want := fmt.Sprintf("big/%02d", k)
		if e.GetIndex() != index || e.GetType() != leasepb.EventType_EVENT_TYPE_EXPIRED ||
			e.GetLease().GetResource() != want || !bytes.Equal(e.GetLease().GetValue(), value(k)) {
			t.Fatalf("event %d: %v %d %s (%d value bytes), want the expiry of %s at %d", k, e.GetType(), e.GetIndex(),
				e.GetLease().GetResource(), len(e.GetLease().GetValue()), want, index)
		}
	}
	t.Logf("%d events of one entry in %d messages", len(got), messages)
}
