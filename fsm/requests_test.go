package fsm

import (
	"reflect"
	"testing"

	"pgregory.net/rapid"
)

// TestRequestIndexCollisionsChangeNothing applies the same random commands to a state machine whose
// request index hashes every key alike (each key after the first goes to the overflow map) and to a
// normal one: every result must be the same, so collisions cannot make nodes disagree.
func TestRequestIndexCollisionsChangeNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		normal, colliding := New(), New()
		colliding.byRequest.hash = func(requestKey) uint64 { return 7 }
		for i := uint64(1); i <= 60; i++ {
			cmd := genCommand(i).Draw(t, "cmd")
			if a := cmd.GetAcquire(); a != nil {
				a.CheckRequestParams = true // as every proposer of this version sets it
			}
			want, err1 := normal.Apply(i, cmd)
			got, err2 := colliding.Apply(i, cmd)
			if !reflect.DeepEqual(want, got) || (err1 == nil) != (err2 == nil) {
				t.Fatalf("entry %d (%v): colliding index answered %+v (%v), normal %+v (%v)", i, cmd, got, err2, want, err1)
			}
		}
	})
}
