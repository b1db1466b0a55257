package fsm

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"pgregory.net/rapid"

	"github.com/leased/leased/api/wirepb"
)

// TestStreamedSnapshotIsTheProtoEncoding: the streamed snapshot (snapshot_stream.go) is byte for byte
// what the deterministic protobuf encoding of the whole SnapshotBody was, for random states (every
// field of a lease record, lock-delays, ends), so snapshots stay readable both ways and equal states
// still encode equally; and proto.Unmarshal of it restores the same state as Restore.
func TestStreamedSnapshotIsTheProtoEncoding(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := New()
		for i := uint64(1); i <= 80; i++ {
			cmd := genCommand(i).Draw(t, "cmd")
			if a := cmd.GetAcquire(); a != nil {
				a.Value = []byte(rapid.SampledFrom([]string{"", "v", "a longer value"}).Draw(t, "value"))
				a.Identity = rapid.SampledFrom([]string{"", "alice"}).Draw(t, "identity")
				a.Limit = uint32(rapid.SampledFrom([]int{0, 0, 2}).Draw(t, "slots"))
			}
			if _, err := f.Apply(i, cmd); err != nil {
				t.Fatal(err)
			}
		}
		got, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(wholeBody(f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[headerSize:], want) {
			t.Fatalf("streamed body differs from the protobuf encoding:\n got %x\nwant %x", got[headerSize:], want)
		}
		g, err := Restore(got)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := g.Snapshot()
		if !bytes.Equal(again, got) {
			t.Fatal("restore -> snapshot changed the bytes")
		}
	})
}

// TestRestoreReadsFieldsInAnyOrder: a body whose fields come in another order than the deterministic one
// (leases before applied_index, records split around other fields) is still a valid protobuf encoding of
// the same body, and restores to the same state.
func TestRestoreReadsFieldsInAnyOrder(t *testing.T) {
	f := sampleState(t)
	body := wholeBody(f)
	opts := proto.MarshalOptions{Deterministic: true}
	leasesOnly, _ := opts.Marshal(&wirepb.SnapshotBody{Leases: body.Leases})
	body.Leases = nil
	others, _ := opts.Marshal(body)
	snap := envelope(append(leasesOnly, others...))
	g, err := Restore(snap)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustSnapshot(t, g), mustSnapshot(t, f); !bytes.Equal(a, b) {
		t.Fatal("a reordered body restored to another state")
	}
}

// wholeBody is the SnapshotBody of f built as one message, the way Snapshot encoded it before streaming.
func wholeBody(f *FSM) *wirepb.SnapshotBody {
	var body wirepb.SnapshotBody
	if err := proto.Unmarshal(mustBody(f), &body); err != nil {
		panic(err)
	}
	body.Leases = nil
	f.byResource.Ascend(func(e entry) bool {
		l := e.lease
		body.Leases = append(body.Leases, &wirepb.LeaseRecord{
			Resource: l.resource, Holder: l.holder.name, Token: l.token, TtlMs: int64(l.ttlMs), Value: bytesOf(l.value),
			LockDelayMs: int64(l.lockDelayMs), RequestId: l.requestID, Checkpointed: l.has(flagCheckpointed),
			RemainingMs: l.remainingMs, Renewed: l.has(flagRenewed), Identity: l.identity, Limit: l.limit,
			Proclaimed: l.has(flagProclaimed),
		})
		return true
	})
	body.Members, body.RemovedMembers = f.Members(), f.removedIDs()
	body.AnsweredRequests = f.answeredRecords()
	return &body
}

func mustBody(f *FSM) []byte {
	snap, err := f.Snapshot()
	if err != nil {
		panic(fmt.Sprint(err))
	}
	return snap[headerSize:]
}

// TestDecodeRecordIsProtoUnmarshal: decodeRecord accepts exactly the lease records proto.Unmarshal does
// and reads the same fields from them, for random field sequences — every LeaseRecord field and an
// unknown one, each with a right or a wrong wire type, repeated, strings that are not UTF-8, values
// that do not fit the field's type — whole or cut short.
func TestDecodeRecordIsProtoUnmarshal(t *testing.T) {
	numbers := []protowire.Number{recResource, recHolder, recToken, recTTLMs, recValue, recLockDelayMs,
		recRequestID, recCheckpointed, recRemainingMs, recRenewed, recIdentity, recLimit, recProclaimed, 99}
	types := []protowire.Type{protowire.VarintType, protowire.BytesType, protowire.Fixed32Type, protowire.Fixed64Type}
	rapid.Check(t, func(t *rapid.T) {
		var b []byte
		for range rapid.IntRange(0, 12).Draw(t, "fields") {
			num := rapid.SampledFrom(numbers).Draw(t, "number")
			typ := rapid.SampledFrom(types).Draw(t, "type")
			b = protowire.AppendTag(b, num, typ)
			switch typ {
			case protowire.VarintType:
				b = protowire.AppendVarint(b, rapid.SampledFrom([]uint64{0, 1, 2, 1 << 31, 1<<32 + 5, 1 << 63, ^uint64(0)}).Draw(t, "varint"))
			case protowire.BytesType:
				b = protowire.AppendBytes(b, []byte(rapid.SampledFrom([]string{"", "r", "héllo", "\xff\xfe", "a\x00b"}).Draw(t, "bytes")))
			case protowire.Fixed32Type:
				b = protowire.AppendFixed32(b, 7)
			case protowire.Fixed64Type:
				b = protowire.AppendFixed64(b, 7)
			}
		}
		if rapid.Bool().Draw(t, "cut") && len(b) > 0 {
			b = b[:rapid.IntRange(0, len(b)-1).Draw(t, "at")]
		}
		var want wirepb.LeaseRecord
		werr := proto.Unmarshal(b, &want)
		var got record
		gerr := decodeRecord(b, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("%x: proto.Unmarshal says %v, decodeRecord %v", b, werr, gerr)
		}
		if werr != nil {
			return
		}
		as := record{
			resource: want.Resource, holder: []byte(want.Holder), token: want.Token, ttlMs: want.TtlMs,
			value: want.Value, lockDelayMs: want.LockDelayMs, requestID: want.RequestId,
			checkpointed: want.Checkpointed, remainingMs: want.RemainingMs, renewed: want.Renewed,
			identity: []byte(want.Identity), limit: want.Limit, proclaimed: want.Proclaimed,
		}
		if !bytes.Equal(got.holder, as.holder) || !bytes.Equal(got.value, as.value) || !bytes.Equal(got.identity, as.identity) {
			t.Fatalf("%x: decodeRecord read holder %q value %q identity %q, proto.Unmarshal %q %q %q", b,
				got.holder, got.value, got.identity, as.holder, as.value, as.identity)
		}
		got.holder, got.value, got.identity, as.holder, as.value, as.identity = nil, nil, nil, nil, nil, nil
		if !reflect.DeepEqual(got, as) {
			t.Fatalf("%x: decodeRecord read\n%+v, proto.Unmarshal\n%+v", b, got, as)
		}
	})
}

// TestRestoreTakesTheBodysFieldsInAnyOrder: a body whose fields come in another order than the encoder's
// — the others reversed and each followed by a lease record, the lease records still in their order —
// restores to the same state, as proto.Unmarshal of the body would.
func TestRestoreTakesTheBodysFieldsInAnyOrder(t *testing.T) {
	f := sampleState(t)
	for i, name := range []string{"x/1", "x/2", "x/3"} {
		if _, err := f.Apply(f.AppliedIndex()+1, acqWith(&wirepb.AcquireCmd{Resource: name, Holder: "h", TtlMs: 1000 + int64(i)})); err != nil {
			t.Fatal(err)
		}
	}
	snap := mustSnapshot(t, f)
	var leases, others [][]byte
	for payload := snap[headerSize:]; len(payload) > 0; {
		n, m, err := consumeField(payload)
		if err != nil {
			t.Fatal(err)
		}
		if isLeaseRecord(payload) {
			leases = append(leases, payload[:n+m])
		} else {
			others = append([][]byte{payload[:n+m]}, others...)
		}
		payload = payload[n+m:]
	}
	if len(leases) < 3 || len(others) < 3 {
		t.Fatalf("sample state has %d lease records and %d other fields; the test needs a few of each", len(leases), len(others))
	}
	var shuffled []byte
	for _, field := range others {
		shuffled = append(shuffled, field...)
		if len(leases) > 0 {
			shuffled, leases = append(shuffled, leases[0]...), leases[1:]
		}
	}
	for _, field := range leases {
		shuffled = append(shuffled, field...)
	}
	if got := mustSnapshot(t, mustRestore(t, envelope(shuffled))); !bytes.Equal(got, snap) {
		t.Fatal("the state restored from the reordered body differs from the original")
	}
}
