package fsm

import (
	"bytes"
	"testing"
)

// FuzzApplyEntry feeds arbitrary entry bytes to a state machine that already holds leases: decoding must
// fail cleanly or apply without panicking, and the state must stay restorable.
func FuzzApplyEntry(f *testing.F) {
	for _, c := range sampleCommands() {
		data, err := EncodeCommand(c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m := sampleState(t)
		if _, err := m.ApplyEntry(m.AppliedIndex()+1, data); err != nil {
			return
		}
		snap := mustSnapshot(t, m)
		r, err := Restore(snap)
		if err != nil {
			t.Fatalf("state after applying %x does not restore: %v", data, err)
		}
		if !bytes.Equal(mustSnapshot(t, r), snap) {
			t.Fatalf("state after applying %x does not round-trip", data)
		}
	})
}

// FuzzRestore feeds arbitrary bytes to Restore: it must return an error and no state, or a state whose
// snapshot restores to a byte-identical snapshot (nothing half-restored or inconsistent comes back).
func FuzzRestore(f *testing.F) {
	f.Add(mustSnapshot(f, sampleState(f)))
	f.Add(mustSnapshot(f, New()))
	f.Add([]byte(snapshotMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Restore(data)
		if err != nil {
			if m != nil {
				t.Fatal("Restore returned a state with an error")
			}
			return
		}
		snap := mustSnapshot(t, m)
		again, err := Restore(snap)
		if err != nil {
			t.Fatalf("re-encoded state does not restore: %v", err)
		}
		if !bytes.Equal(mustSnapshot(t, again), snap) {
			t.Fatal("re-encoded state does not round-trip")
		}
	})
}
