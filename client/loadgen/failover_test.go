package loadgen_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/leased/leased/client"
	"github.com/leased/leased/client/loadgen"
)

// manualClock is a clock that moves only when told.
type manualClock struct{ t time.Time }

func (c *manualClock) now() time.Time          { return c.t }
func (c *manualClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// epoch is d after the manual clocks' start.
func epoch(d time.Duration) time.Time { return time.Unix(0, 0).Add(d) }

// Outages finds every stretch longer than the gap between two successes, tells each as it starts and
// ends, and reports the one the run ends in as not ended.
func TestOutagesFromTheOperationsTimes(t *testing.T) {
	clock := &manualClock{t: time.Unix(0, 0)}
	var events []string
	f := loadgen.Failover{
		Gap:       ms(100),
		OnServing: func() { events = append(events, "serving") },
		OnDown:    func(o loadgen.Outage) { events = append(events, fmt.Sprint("down since ", o.Start, " for ", o.Length)) },
		OnUp:      func(o loadgen.Outage) { events = append(events, fmt.Sprint("up after ", o.Length)) },
	}
	o := loadgen.NewOutages(f, clock.now)
	e0, e1, e2 := errors.New("e0"), errors.New("e1"), errors.New("e2")
	step := func(d time.Duration, fn func()) { clock.advance(d); fn() }
	step(ms(10), func() { o.Failed(e0) }) // before the first success: no outage yet
	step(ms(10), o.Succeeded)             // 20 ms: serving
	step(ms(50), o.Succeeded)             // 70 ms: 50 ms later, no outage
	step(ms(60), o.Check)                 // 130 ms: 60 ms since, not yet
	step(ms(50), func() { o.Failed(e1) }) // 180 ms: 110 ms since 70 ms: down
	step(ms(100), o.Check)                // told once only
	step(0, func() { o.Failed(e2) })
	step(ms(20), o.Succeeded)  // 300 ms: up after 230 ms, 2 failures, the first e1
	step(ms(150), o.Succeeded) // 450 ms: 150 ms with no Check between: down, then up
	step(ms(101), func() {})   // 551 ms: the run ends 101 ms after its last success
	got := o.End()
	want := []loadgen.Outage{
		{Start: ms(70), At: epoch(ms(70)), Length: ms(230), Ended: true, Errors: 2, FirstErr: e1},
		{Start: ms(300), At: epoch(ms(300)), Length: ms(150), Ended: true},
		{Start: ms(450), At: epoch(ms(450)), Length: ms(101), Ended: false},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outages\n got %+v\nwant %+v", got, want)
	}
	wantEvents := []string{"serving", "down since 70ms for 110ms", "up after 230ms", "down since 300ms for 150ms", "up after 150ms"}
	if !reflect.DeepEqual(events, wantEvents) {
		t.Fatalf("events %q, want %q", events, wantEvents)
	}
	r := loadgen.FailoverResult{Outages: got}
	if r.OutageMedian() != ms(150) || r.OutageMax() != ms(230) {
		t.Fatalf("median %v, max %v", r.OutageMedian(), r.OutageMax())
	}
	if (loadgen.FailoverResult{}).OutageMedian() != 0 || (loadgen.FailoverResult{Outages: got[:2]}).OutageMedian() != ms(190) {
		t.Fatal("median of none or of two")
	}
}

// A run that never succeeded, or whose last success is within the gap, has no outage.
func TestOutagesNoneWithoutAGap(t *testing.T) {
	clock := &manualClock{t: time.Unix(0, 0)}
	o := loadgen.NewOutages(loadgen.Failover{Gap: ms(100)}, clock.now)
	clock.advance(time.Hour)
	o.Failed(errors.New("down from the start"))
	if got := o.End(); len(got) != 0 {
		t.Fatalf("outages before the first success: %+v", got)
	}
	o.Succeeded()
	clock.advance(ms(100)) // exactly the gap is not more than it
	if got := o.End(); len(got) != 0 {
		t.Fatalf("outages within the gap: %+v", got)
	}
}

func TestFailoverValidate(t *testing.T) {
	if err := (loadgen.Failover{Gap: 0}).Validate(); err == nil {
		t.Fatal("gap 0 accepted")
	}
	p := &loadgen.Pool{}
	if _, err := p.Failover(context.Background(), loadgen.Options{Duration: time.Second}, "x", time.Second, loadgen.Failover{Gap: -1}); err == nil {
		t.Fatal("Pool.Failover ran with a negative gap")
	}
}

// testFailover: without a fault, the failover worker acquires and releases; nothing is left held, and
// OnServing is told once.
func testFailover(t *testing.T, sdk *client.Client, eps []string) {
	ctx := context.Background()
	pool, err := loadgen.NewPool(client.Config{Endpoints: eps}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	serving := 0
	r, err := pool.Failover(ctx, loadgen.Options{Clients: 5, Duration: 300 * time.Millisecond, OpTimeout: 10 * time.Second}, "fo", 30*time.Second,
		loadgen.Failover{Gap: time.Hour, OnServing: func() { serving++ }})
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops == 0 || r.Errors != 0 || len(r.Outages) != 0 || r.ReleaseErrors != 0 || serving != 1 {
		t.Fatalf("%+v, serving told %d times", r, serving)
	}
	if left, _, err := sdk.List(ctx, client.ListOptions{Prefix: "fo/"}); err != nil || len(left) != 0 {
		t.Fatalf("after failover: %d leases left, %v", len(left), err)
	}
}
