package chaos

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// The history of client operations and the sequential lease model porcupine checks it against (I6).

type opKind int

const (
	opAcquire opKind = iota + 1
	opRelease
	opGet
)

func (k opKind) String() string {
	switch k {
	case opAcquire:
		return "acquire"
	case opRelease:
		return "release"
	case opGet:
		return "get"
	}
	return "?"
}

// outcome of an operation as the client saw it.
type outcome int

const (
	outOK       outcome = iota + 1 // acquire granted (or replayed), release done, get found
	outHeld                        // acquire refused: held by Holder with Token
	outNotFound                    // release: token not current; get: nobody holds it
	outUnknown                     // timeout / unavailable: may or may not have happened
	outFailed                      // refused before anything happened (invalid, limit)
)

func (o outcome) String() string {
	return [...]string{"", "ok", "held", "not-found", "unknown", "failed"}[o]
}

type opInput struct {
	Kind     opKind
	Resource string
	Holder   string // acquire: who asks
	ReqID    string // acquire: idempotency key
	Token    uint64 // release: the token released
}

type opOutput struct {
	Out    outcome
	Holder string // acquire ok / held, get ok
	Token  uint64 // acquire ok / held, get ok
}

// op is one recorded operation; times are nanoseconds since the history began.
type op struct {
	Client int
	In     opInput
	Out    opOutput
	Call   int64
	Return int64 // meaningless for outUnknown
	// Attempt is 0 for the first call of an intent (a fresh request id), n for the harness's n-th retry
	// with the same request id.
	Attempt int
}

// history records operations from many goroutines.
type history struct {
	start time.Time
	mu    sync.Mutex
	ops   []op
}

func newHistory() *history { return &history{start: time.Now()} }

func (h *history) now() int64 { return int64(time.Since(h.start)) }

func (h *history) add(o op) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops = append(h.ops, o)
}

func (h *history) snapshot() []op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.ops)
}

// leaseState is the model's state of one resource: free, or held by (Holder, ReqID) with Token. Token 0
// means held under a grant whose answer was lost (unknown token, > Last). Last is the highest token the
// model knows was granted on the resource; every new grant must exceed it (I1 as seen by clients).
type leaseState struct {
	Held   bool
	Holder string
	ReqID  string
	Token  uint64
	Last   uint64
}

// fits reports whether token t can be the current grant of s (known, or unknown and above Last).
func (s leaseState) fits(t uint64) bool {
	return s.Held && (s.Token == t || (s.Token == 0 && t > s.Last))
}

func (s leaseState) reveal(t uint64) leaseState {
	if s.Token == 0 {
		s.Token, s.Last = t, max(s.Last, t)
	}
	return s
}

// stepLease is the sequential specification. It is nondeterministic in two ways: a held lease may expire
// (become free) before any operation, because expiry is decided by the leader's clock, which the model
// cannot see; and an operation with an unknown outcome may or may not have taken effect. The model never
// rejects a correct history: it only demands what the contract guarantees whatever the timing.
func stepLease(s leaseState, in opInput, out opOutput) []leaseState {
	pre := []leaseState{s}
	if s.Held {
		pre = append(pre, leaseState{Last: s.Last}) // it expired just before this operation
	}
	var next []leaseState
	for _, p := range pre {
		next = append(next, stepOne(p, in, out)...)
	}
	return next
}

func stepOne(s leaseState, in opInput, out opOutput) []leaseState {
	switch in.Kind {
	case opAcquire:
		mine := s.Held && s.Holder == in.Holder && s.ReqID == in.ReqID
		switch out.Out {
		case outOK:
			switch {
			case mine && s.fits(out.Token): // a retry of the intent that made the grant (decision 5)
				return []leaseState{s.reveal(out.Token)}
			case !s.Held && out.Token > s.Last:
				return []leaseState{{Held: true, Holder: in.Holder, ReqID: in.ReqID, Token: out.Token, Last: out.Token}}
			}
			return nil
		case outHeld:
			if s.Held && !mine && s.Holder == out.Holder && s.fits(out.Token) {
				return []leaseState{s.reveal(out.Token)}
			}
			return nil
		case outUnknown:
			if !s.Held {
				return []leaseState{s, {Held: true, Holder: in.Holder, ReqID: in.ReqID, Last: s.Last}}
			}
			return []leaseState{s}
		case outFailed:
			return []leaseState{s}
		}
	case opRelease:
		switch out.Out {
		case outOK:
			var next []leaseState
			if s.fits(in.Token) {
				next = append(next, leaseState{Last: max(s.Last, in.Token)})
			}
			if in.Token <= s.Last && !(s.Held && s.Token == in.Token) {
				// An earlier grant already released: Release is idempotent and answers OK again
				// (already_released). The model cannot tell released from expired; the log checker can.
				next = append(next, s)
			}
			return next
		case outNotFound:
			if !s.Held || s.Token != in.Token { // with an unknown token, assume it was another one
				return []leaseState{s}
			}
			return nil
		case outUnknown:
			if s.fits(in.Token) {
				return []leaseState{s, {Last: max(s.Last, in.Token)}}
			}
			return []leaseState{s}
		case outFailed:
			return []leaseState{s}
		}
	case opGet:
		switch out.Out {
		case outOK:
			if s.Held && s.Holder == out.Holder && s.fits(out.Token) {
				return []leaseState{s.reveal(out.Token)}
			}
			return nil
		case outNotFound:
			if !s.Held {
				return []leaseState{s}
			}
			return nil
		default:
			return []leaseState{s}
		}
	}
	return nil
}

var leaseModel = porcupine.NondeterministicModel{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range ops {
			r := o.Input.(opInput).Resource
			if _, ok := by[r]; !ok {
				keys = append(keys, r)
			}
			by[r] = append(by[r], o)
		}
		slices.Sort(keys)
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{leaseState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		var out []interface{}
		for _, s := range stepLease(state.(leaseState), input.(opInput), output.(opOutput)) {
			out = append(out, s)
		}
		return out
	},
	Equal: func(a, b interface{}) bool { return a.(leaseState) == b.(leaseState) },
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(opInput), output.(opOutput)
		var s string
		switch in.Kind {
		case opAcquire:
			s = fmt.Sprintf("acquire(%s, %s)", in.Holder, in.ReqID)
		case opRelease:
			s = fmt.Sprintf("release(%d)", in.Token)
		case opGet:
			s = "get()"
		}
		switch out.Out {
		case outOK, outHeld:
			if in.Kind != opRelease {
				return fmt.Sprintf("%s -> %v %s/%d", s, out.Out, out.Holder, out.Token)
			}
		}
		return fmt.Sprintf("%s -> %v", s, out.Out)
	},
	DescribeState: func(state interface{}) string {
		s := state.(leaseState)
		if !s.Held {
			return fmt.Sprintf("free (last %d)", s.Last)
		}
		tok := "?"
		if s.Token != 0 {
			tok = fmt.Sprint(s.Token)
		}
		return fmt.Sprintf("held %s/%s (last %d)", s.Holder, tok, s.Last)
	},
}

// porcupineOps turns recorded operations into porcupine's: unknown outcomes return "at infinity" (after
// everything else), and reads with unknown outcomes are dropped (they changed nothing).
func porcupineOps(ops []op) []porcupine.Operation {
	var end int64
	for _, o := range ops {
		end = max(end, o.Call)
		if o.Out.Out != outUnknown { // an unknown outcome's Return means nothing (history.jsonl: MaxInt64)
			end = max(end, o.Return)
		}
	}
	var out []porcupine.Operation
	for i, o := range ops {
		if o.Out.Out == outUnknown && o.In.Kind == opGet {
			continue
		}
		ret := o.Return
		if o.Out.Out == outUnknown {
			ret = end + int64(time.Second) + int64(i)
		}
		out = append(out, porcupine.Operation{ClientId: o.Client, Input: o.In, Call: o.Call, Output: o.Out, Return: ret})
	}
	slices.SortStableFunc(out, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
	return out
}

// linearizability is the I6 verdict.
type linearizability struct {
	Result   porcupine.CheckResult
	Ops      int
	Visual   string // path of the HTML visualisation, written when not Ok
	Elapsed  time.Duration
	Failures int // partitions (resources) that were not linearizable
	// Resources names them (TestRecheckHistory prints their operations and events)
	Resources []string
}

// checkLinearizable runs porcupine over ops; when the result is not Ok it writes the history (JSON) and
// porcupine's visualisation into dir.
func checkLinearizable(ops []op, dir string, timeout time.Duration) linearizability {
	model := leaseModel.ToModel()
	pops := porcupineOps(ops)
	start := time.Now()
	res, info := porcupine.CheckOperationsVerbose(model, pops, timeout)
	v := linearizability{Result: res, Ops: len(pops), Elapsed: time.Since(start)}
	if res != porcupine.Ok && dir != "" {
		v.Visual = filepath.Join(dir, "linearizability.html")
		_ = porcupine.VisualizePath(model, info, v.Visual)
		// which partitions fail: check each on its own (cheap once the whole failed)
		for _, part := range model.Partition(pops) {
			if porcupine.CheckOperationsTimeout(model, part, 10*time.Second) == porcupine.Illegal {
				v.Failures++
				v.Resources = append(v.Resources, part[0].Input.(opInput).Resource)
			}
		}
	}
	return v
}

// writeHistory saves the raw history as JSON lines next to the other artifacts.
func writeHistory(ops []op, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, o := range ops {
		if o.Out.Out == outUnknown {
			o.Return = math.MaxInt64
		}
		if err := enc.Encode(o); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
