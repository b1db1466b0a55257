package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/leased/leased/api/wirepb"
)

func sampleState(t testing.TB) *FSM {
	a := newApplier(t)
	a.apply(acqWith(&wirepb.AcquireCmd{Resource: "svc/leader", Holder: "node-1", TtlMs: 5000, Value: []byte("10.0.0.1:80"), RequestId: "q"}))
	a.apply(acqWith(&wirepb.AcquireCmd{Resource: "cron/backup", Holder: "node-2", TtlMs: 9000, LockDelayMs: 1500}))
	a.apply(acqWith(&wirepb.AcquireCmd{Resource: "cron/vacuum", Holder: "node-2", TtlMs: 9000, LockDelayMs: 1500}))
	a.apply(expire("cron/vacuum", 3))
	a.apply(checkpoint(&wirepb.LeaseCheckpoint{Resource: "svc/leader", Token: 1, RemainingMs: 1234}))
	return a.f
}

func TestSnapshotRoundTripIsByteIdentical(t *testing.T) {
	f := sampleState(t)
	snap := mustSnapshot(t, f)
	g, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustSnapshot(t, g), snap) {
		t.Fatal("restore -> snapshot changed the bytes")
	}
	l, ok := g.Get("svc/leader")
	if !ok || string(l.Value) != "10.0.0.1:80" || l.RemainingMs != 1234 || !l.Checkpointed || l.Renewed {
		t.Fatalf("restored lease = %+v", l)
	}
	if d, ok := g.LockDelayOf("cron/vacuum"); !ok || d.Token != 3 || d.Index != 4 {
		t.Fatalf("restored lock-delay = %+v %v", d, ok)
	}
	if g.AppliedIndex() != 5 || g.HighestToken() != 3 || g.HolderCount("node-2") != 1 {
		t.Fatalf("restored applied=%d highest=%d", g.AppliedIndex(), g.HighestToken())
	}
}

func TestSameLogGivesByteIdenticalSnapshots(t *testing.T) {
	// Lock-delays live in a map; many of them make any leak of map iteration order visible.
	build := func() []byte {
		a := newApplier(t)
		for i := range 50 {
			r := fmt.Sprintf("res-%02d", (i*37)%50)
			tok := a.apply(acqWith(&wirepb.AcquireCmd{Resource: r, Holder: fmt.Sprintf("h%d", i%7), TtlMs: 100, LockDelayMs: 10})).Lease.Token
			if i%2 == 0 {
				a.apply(expire(r, int(tok)))
			}
		}
		return mustSnapshot(t, a.f)
	}
	first := build()
	for range 10 {
		if !bytes.Equal(build(), first) {
			t.Fatal("applying the same log twice gave different snapshot bytes")
		}
	}
}

func TestRestoreRejectsDamagedSnapshots(t *testing.T) {
	good := mustSnapshot(t, sampleState(t))
	reseal := func(body *wirepb.SnapshotBody) []byte {
		payload, _ := proto.MarshalOptions{Deterministic: true}.Marshal(body)
		out := append([]byte(nil), good[:headerSize]...)
		binary.BigEndian.PutUint64(out[12:], uint64(len(payload)))
		binary.BigEndian.PutUint32(out[20:], crc32.Checksum(payload, castagnoli))
		return append(out, payload...)
	}
	flip := append([]byte(nil), good...)
	flip[len(flip)-3] ^= 0x40
	badVersion := append([]byte(nil), good...)
	badVersion[11] = 9
	tests := map[string][]byte{
		"empty":          nil,
		"short header":   good[:10],
		"truncated body": good[:len(good)-1],
		"flipped bit":    flip,
		"wrong magic":    append([]byte("NOTASNAP"), good[8:]...),
		"wrong version":  badVersion,
		"duplicate lease": reseal(&wirepb.SnapshotBody{AppliedIndex: 9, HighestToken: 5, Leases: []*wirepb.LeaseRecord{
			{Resource: "a", Holder: "h", Token: 1, TtlMs: 1}, {Resource: "a", Holder: "h", Token: 2, TtlMs: 1}}}),
		"unsorted leases": reseal(&wirepb.SnapshotBody{AppliedIndex: 9, HighestToken: 5, Leases: []*wirepb.LeaseRecord{
			{Resource: "b", Holder: "h", Token: 1, TtlMs: 1}, {Resource: "a", Holder: "h", Token: 2, TtlMs: 1}}}),
		"token above highest": reseal(&wirepb.SnapshotBody{AppliedIndex: 9, HighestToken: 5, Leases: []*wirepb.LeaseRecord{
			{Resource: "a", Holder: "h", Token: 6, TtlMs: 1}}}),
		"highest above applied": reseal(&wirepb.SnapshotBody{AppliedIndex: 4, HighestToken: 5}),
		"leased and delayed": reseal(&wirepb.SnapshotBody{AppliedIndex: 9, HighestToken: 5,
			Leases:     []*wirepb.LeaseRecord{{Resource: "a", Holder: "h", Token: 5, TtlMs: 1}},
			LockDelays: []*wirepb.LockDelayRecord{{Resource: "a", Token: 2, Index: 3, DelayMs: 1}}}),
	}
	for name, data := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := Restore(data)
			if !errors.Is(err, ErrBadSnapshot) || f != nil {
				t.Fatalf("Restore = %v, %v; want ErrBadSnapshot and no FSM", f, err)
			}
		})
	}
}
