package fsm

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/api/wirepb"
)

func distinctAcquires(n int, requestIDs bool) []*wirepb.Command {
	cmds := make([]*wirepb.Command, n)
	for i := range cmds {
		c := &wirepb.AcquireCmd{Resource: fmt.Sprintf("r/%07d", i), Holder: fmt.Sprintf("h%03d", i%1000), TtlMs: 10_000}
		if requestIDs {
			c.RequestId = fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15)
		}
		cmds[i] = acqWith(c)
	}
	return cmds
}

// BenchmarkApplyAcquire measures Apply of grants on distinct resources (the decoded command; decoding is
// measured separately below). Goal: >= 1,000,000 applies/s on one core.
func BenchmarkApplyAcquire(b *testing.B) {
	cmds := distinctAcquires(b.N, true)
	f := New()
	b.ReportAllocs()
	b.ResetTimer()
	for i, c := range cmds {
		if res, err := f.Apply(uint64(i+1), c); err != nil || res.Code != OK {
			b.Fatalf("apply: %v %v", res.Code, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "applies/s")
}

// BenchmarkApplyEntryAcquire is BenchmarkApplyAcquire including protobuf decoding of the entry.
func BenchmarkApplyEntryAcquire(b *testing.B) {
	cmds := distinctAcquires(b.N, true)
	entries := make([][]byte, len(cmds))
	for i, c := range cmds {
		entries[i], _ = EncodeCommand(c)
	}
	cmds = nil
	f := New()
	b.ReportAllocs()
	b.ResetTimer()
	for i, data := range entries {
		if _, err := f.ApplyEntry(uint64(i+1), data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "applies/s")
}

// BenchmarkMemoryPerLease reports the heap bytes per live lease with 1,000,000 leases (short names, no
// value), with and without a request id, and with request ids and authentication on (each of the 1,000
// holders acquires as its own identity, a certificate's name of 23 bytes). Goal: <= 300 bytes.
func BenchmarkMemoryPerLease(b *testing.B) {
	for _, v := range []struct {
		name               string
		withIDs, withIdent bool
	}{{"request_id=false", false, false}, {"request_id=true", true, false}, {"request_id=true,identity=true", true, true}} {
		b.Run(v.name, func(b *testing.B) {
			const n = 1_000_000
			for range b.N {
				// Measured from before the commands exist: a lease keeps its command's strings alive.
				before := heapInUse()
				cmds := distinctAcquires(n, v.withIDs)
				f := New()
				if v.withIdent {
					for _, c := range cmds {
						acq := c.GetAcquire()
						acq.Identity = "client-" + acq.Holder + ".example.com"
					}
					if _, err := f.Apply(uint64(n+1), setACL(false, rule("*", "", leasepb.Permission_PERMISSION_LEASE))); err != nil {
						b.Fatal(err)
					}
				}
				for i, c := range cmds {
					if res, err := f.Apply(uint64(n+i+2), c); err != nil || res.Code != OK {
						b.Fatal(res.Code, err)
					}
				}
				cmds = nil
				after := heapInUse()
				b.ReportMetric(float64(after-before)/n, "bytes/lease")
				runtime.KeepAlive(f)
			}
		})
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkSnapshot measures encoding a snapshot of 100,000 leases.
func BenchmarkSnapshot(b *testing.B) {
	f := New()
	for i, c := range distinctAcquires(100_000, true) {
		_, _ = f.Apply(uint64(i+1), c)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var size int
	for range b.N {
		snap, err := f.Snapshot()
		if err != nil {
			b.Fatal(err)
		}
		size = len(snap)
	}
	b.ReportMetric(float64(size), "bytes")
}

// BenchmarkView measures what a snapshot costs the apply: freezing the state (View, under the node's FSM
// lock) of 1,000,000 leases with the remembered-ends ring full, and the first changes after it, which copy
// what they touch (writable). The encoding itself runs beside the apply (BenchmarkSnapshot measures it).
func BenchmarkView(b *testing.B) {
	f := New()
	cmds := distinctAcquires(1_000_000+MaxRememberedEnds, true)
	for i, c := range cmds {
		_, _ = f.Apply(uint64(i+1), c)
	}
	idx := uint64(len(cmds))
	for i := range MaxRememberedEnds {
		idx++
		_, _ = f.Apply(idx, rel(cmds[i].GetAcquire().GetResource(), uint64(i+1)))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		v := f.View()
		if v.Leases() != 1_000_000 {
			b.Fatalf("view of %d leases", v.Leases())
		}
	}
	b.StopTimer()
	// The first checkpoint of 1,000 leases after a view: each is copied once.
	cps := make([]*wirepb.LeaseCheckpoint, 1000)
	for i := range cps {
		tok := uint64(MaxRememberedEnds + i + 1)
		cps[i] = &wirepb.LeaseCheckpoint{Resource: cmds[tok-1].GetAcquire().GetResource(), Token: tok, RemainingMs: 5}
	}
	idx++
	start := time.Now()
	if _, err := f.Apply(idx, checkpoint(cps...)); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/1000, "ns/checkpointed-after-view")
}

// BenchmarkMemoryPerEnd reports the heap bytes per remembered lease end (ends.go) with the ring full:
// MaxRememberedEnds leases granted and released (short names), less what the same leases cost live.
func BenchmarkMemoryPerEnd(b *testing.B) {
	for range b.N {
		cmds := distinctAcquires(MaxRememberedEnds, false)
		before := heapInUse()
		f := New()
		for i, c := range cmds {
			if _, err := f.Apply(uint64(2*i+1), c); err != nil {
				b.Fatal(err)
			}
			if _, err := f.Apply(uint64(2*i+2), rel(c.GetAcquire().GetResource(), uint64(2*i+1))); err != nil {
				b.Fatal(err)
			}
		}
		after := heapInUse()
		if f.RememberedEnds() != MaxRememberedEnds || f.Len() != 0 {
			b.Fatalf("remembers %d ends with %d leases live", f.RememberedEnds(), f.Len())
		}
		b.ReportMetric(float64(after-before)/MaxRememberedEnds, "bytes/end")
		runtime.KeepAlive(f)
		runtime.KeepAlive(cmds)
	}
}

// BenchmarkRestore measures decoding a snapshot of 100,000 leases into a state machine (a node's start
// and a follower's catch-up).
func BenchmarkRestore(b *testing.B) {
	f := New()
	for i, c := range distinctAcquires(100_000, true) {
		_, _ = f.Apply(uint64(i+1), c)
	}
	snap, err := f.Snapshot()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := Restore(snap); err != nil {
			b.Fatal(err)
		}
	}
}

// benchHeld is an FSM holding n leases granted by distinctAcquires (applied at indexes 1..n), with a View
// taken after them, as a node has after a snapshot. While the view is live (it is being encoded) the
// first change of each lease copies it; once released (the snapshot is written), leases change in place.
func benchHeld(b *testing.B, n int, live bool) *FSM {
	f := New()
	for i, c := range distinctAcquires(n, true) {
		if res, err := f.Apply(uint64(i+1), c); err != nil || res.Code != OK {
			b.Fatalf("apply: %v %v", res.Code, err)
		}
	}
	if v := f.View(); !live {
		v.Release()
	}
	return f
}

// benchMassApply measures the apply of commands made by mk of 1,000 leases each (the default
// --expiry-batch) naming all of the 200,000 leases an FSM holds, as after a mass disconnect, and reports
// it per lease; applied says whether a command's result is what it should be. It runs once with the
// snapshot view the FSM took after the grants still live, once with it released.
func benchMassApply(b *testing.B, mk func(refs []*leasepb.LeaseRef) *wirepb.Command, applied func(Result) bool) {
	for _, view := range []string{"live", "released"} {
		b.Run("view="+view, func(b *testing.B) { benchMassApplyHeld(b, view == "live", mk, applied) })
	}
}

func benchMassApplyHeld(b *testing.B, liveView bool, mk func(refs []*leasepb.LeaseRef) *wirepb.Command, applied func(Result) bool) {
	const n, per = 200_000, 1000
	for b.Loop() {
		b.StopTimer()
		f := benchHeld(b, n, liveView)
		var cmds []*wirepb.Command
		for i := 0; i < n; i += per {
			var refs []*leasepb.LeaseRef
			for j := i; j < min(i+per, n); j++ {
				refs = append(refs, &leasepb.LeaseRef{Resource: fmt.Sprintf("r/%07d", j), Token: uint64(j + 1)})
			}
			cmds = append(cmds, mk(refs))
		}
		b.StartTimer()
		for i, c := range cmds {
			if res, err := f.Apply(uint64(n+1+i), c); err != nil || !applied(res) {
				b.Fatalf("apply: %v %v", res.Code, err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/lease")
}

// BenchmarkApplyExpire: every held lease expires (a mass disconnect).
func BenchmarkApplyExpire(b *testing.B) {
	benchMassApply(b, func(refs []*leasepb.LeaseRef) *wirepb.Command {
		return &wirepb.Command{Op: &wirepb.Command_Expire{Expire: &wirepb.ExpireCmd{Leases: refs}}}
	}, func(res Result) bool { return len(res.Events) > 0 })
}

// BenchmarkApplyCheckpoint: the idle checkpoints that precede those expiries.
func BenchmarkApplyCheckpoint(b *testing.B) {
	benchMassApply(b, func(refs []*leasepb.LeaseRef) *wirepb.Command {
		cps := make([]*wirepb.LeaseCheckpoint, len(refs))
		for i, r := range refs {
			cps[i] = &wirepb.LeaseCheckpoint{Resource: r.GetResource(), Token: r.GetToken(), RemainingMs: 6_000}
		}
		return &wirepb.Command{Op: &wirepb.Command_Checkpoint{Checkpoint: &wirepb.CheckpointCmd{Leases: cps}}}
	}, func(res Result) bool { return len(res.Changes.Checkpointed) > 0 })
}

// BenchmarkLookup: finding a lease by name among a million, names in random order (what an Acquire,
// Release or Renew entry does first; a checkpoint storm's names come sorted, and cost less).
func BenchmarkLookup(b *testing.B) {
	const n = 1_000_000
	f := New()
	for i, c := range distinctAcquires(n, false) {
		if _, err := f.Apply(uint64(i+1), c); err != nil {
			b.Fatal(err)
		}
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("r/%07d", i)
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(n)
	i := 0
	for b.Loop() {
		j := order[i%n]
		i++
		if _, ok := f.current(names[j], uint64(j+1)); !ok {
			b.Fatalf("lease %d not found", j)
		}
	}
}
