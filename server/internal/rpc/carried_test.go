package rpc

import (
	"errors"
	"testing"

	"github.com/leased/leased/fsm"
)

// A queued acquire learns its carried grant from the entry's result, by its own id only, and every one
// still waiting learns a lost leadership's error; an id it gave up (cancel) is answered no more.
func TestCarriedAcquiresAreAnsweredByTheirID(t *testing.T) {
	o := &LeaseOps{carried: newCarriedWaits()}
	granted, grantedOut := o.carried.register()
	waiting, waitingOut := o.carried.register()
	gone, goneOut := o.carried.register()
	if granted == waiting || granted == 0 || waiting == 0 {
		t.Fatalf("ids %d and %d: want two distinct, non-zero ids", granted, waiting)
	}
	o.carried.cancel(gone)

	o.DeliverCarried(granted+waiting+gone, fsm.Result{Code: fsm.Held}) // nobody's id
	o.DeliverCarried(0, fsm.Result{Code: fsm.Held})
	o.DeliverCarried(granted, fsm.Result{Code: fsm.OK})
	if out, ok := answered(grantedOut); !ok || out.err != nil || out.result.Code != fsm.OK {
		t.Fatalf("granted acquire's outcome %+v (answered %v), want its entry's result", out, ok)
	}
	if out, ok := answered(waitingOut); ok {
		t.Fatalf("an acquire no entry carried was answered: %+v", out)
	}

	lost := errors.New("leadership lost")
	o.FailCarried(lost)
	if out, ok := answered(waitingOut); !ok || !errors.Is(out.err, lost) {
		t.Fatalf("waiting acquire's outcome %+v (answered %v), want the lost leadership", out, ok)
	}
	if out, ok := answered(goneOut); ok {
		t.Fatalf("a cancelled acquire was answered: %+v", out)
	}
	if out, ok := answered(grantedOut); ok {
		t.Fatalf("the granted acquire was answered twice: %+v", out)
	}
	o.DeliverCarried(waiting, fsm.Result{Code: fsm.OK}) // answered once: a later entry is no one's, and does not block
}

// answered is the outcome already sent on ch, if any: the waits answer synchronously, into a buffer.
func answered(ch <-chan carriedOutcome) (carriedOutcome, bool) {
	select {
	case out := <-ch:
		return out, true
	default:
		return carriedOutcome{}, false
	}
}
