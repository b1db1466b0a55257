package raftnode

import (
	"errors"
	"testing"
)

// A proposer learns its entry's outcome by its own id only, once; every one still waiting learns a lost
// leadership's error; an id given up (Cancel) is answered no more, and nothing delivered ever blocks.
func TestWaiterAnswersEachProposerByItsID(t *testing.T) {
	w := NewWaiter[string]()
	applied, appliedOut := w.Register()
	waiting, waitingOut := w.Register()
	gone, goneOut := w.Register()
	if applied == waiting || applied == 0 || waiting == 0 {
		t.Fatalf("ids %d and %d: want two distinct, non-zero ids", applied, waiting)
	}
	w.Cancel(gone)

	w.Deliver(applied+waiting+gone, Outcome[string]{Result: "nobody's"})
	w.Deliver(0, Outcome[string]{Result: "no proposer"})
	w.Deliver(applied, Outcome[string]{Index: 7, Result: "applied"})
	if out, ok := answered(appliedOut); !ok || out.Err != nil || out.Result != "applied" || out.Index != 7 {
		t.Fatalf("applied proposal's outcome %+v (answered %v), want its entry's result", out, ok)
	}
	if out, ok := answered(waitingOut); ok {
		t.Fatalf("a proposal no entry answered was answered: %+v", out)
	}

	lost := errors.New("leadership lost")
	w.FailAll(lost)
	if out, ok := answered(waitingOut); !ok || !errors.Is(out.Err, lost) {
		t.Fatalf("waiting proposal's outcome %+v (answered %v), want the lost leadership", out, ok)
	}
	if out, ok := answered(goneOut); ok {
		t.Fatalf("a cancelled proposal was answered: %+v", out)
	}
	if out, ok := answered(appliedOut); ok {
		t.Fatalf("the applied proposal was answered twice: %+v", out)
	}
	w.Deliver(waiting, Outcome[string]{Result: "late"}) // answered once: a later entry is no one's
	if n := w.Waiting(); n != 0 {
		t.Fatalf("%d proposers still wait", n)
	}
}

// answered is the outcome already sent on ch, if any: the waiter answers synchronously, into a buffer.
func answered[R any](ch <-chan Outcome[R]) (Outcome[R], bool) {
	select {
	case out := <-ch:
		return out, true
	default:
		return Outcome[R]{}, false
	}
}
