package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestRecheckHistory re-checks a saved run: LEASED_CHAOS_RECHECK=<artifact dir> reads its
// history.jsonl, checks each resource on its own, and for every resource that is not linearizable
// prints its operations (in call order, times from the start of the run) and its applied events from
// events.txt. Without the variable it checks itself on a saved run it writes: a resource granted a
// lower token after a higher one, which it must report, beside a resource whose history is fine.
func TestRecheckHistory(t *testing.T) {
	dir := os.Getenv("LEASED_CHAOS_RECHECK")
	if dir == "" {
		dir = t.TempDir()
		ops := []op{
			acq(0, "a", "a1", 0, 10, outOK, "a", 7), acq(1, "b", "b1", 20, 30, outOK, "b", 6), // 6 after 7 on "bad"
			acq(0, "a", "a2", 0, 10, outOK, "a", 7),
		}
		ops[0].In.Resource, ops[1].In.Resource, ops[2].In.Resource = "bad", "bad", "good"
		if err := writeHistory(ops, filepath.Join(dir, "history.jsonl")); err != nil {
			t.Fatal(err)
		}
		found := recheck(t, dir)
		if len(found) != 1 || !strings.HasPrefix(found[0], "bad is not linearizable") {
			t.Fatalf("recheck of a run with one bad resource found %q", found)
		}
		return
	}
	for _, f := range recheck(t, dir) {
		t.Error(f)
	}
}

// recheck describes each resource of the run in dir that is not linearizable.
func recheck(t *testing.T, dir string) []string {
	ops := readHistory(t, filepath.Join(dir, "history.jsonl"))
	model := leaseModel.ToModel()
	var found []string
	for _, part := range model.Partition(porcupineOps(ops)) {
		if porcupine.CheckOperationsTimeout(model, part, time.Minute) != porcupine.Illegal {
			continue
		}
		res := part[0].Input.(opInput).Resource
		var b strings.Builder
		for _, o := range ops {
			if o.In.Resource == res {
				b.WriteString("  " + describeOp(o) + "\n")
			}
		}
		found = append(found, fmt.Sprintf("%s is not linearizable; its operations:\n%s\nits events:\n%s", res, b.String(),
			grepEvents(filepath.Join(dir, "events.txt"), res)))
	}
	return found
}

func describeOp(o op) string {
	ret := "?"
	if o.Out.Out != outUnknown {
		ret = time.Duration(o.Return).String()
	}
	return fmt.Sprintf("%v .. %s  client %d attempt %d: %s", time.Duration(o.Call), ret, o.Client, o.Attempt,
		leaseModel.DescribeOperation(o.In, o.Out))
}

func readHistory(t *testing.T, path string) []op {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ops []op
	dec := json.NewDecoder(bufio.NewReader(f))
	for dec.More() {
		var o op
		if err := dec.Decode(&o); err != nil {
			t.Fatal(err)
		}
		ops = append(ops, o)
	}
	return ops
}

func grepEvents(path, res string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == res {
			out.WriteString("  " + line + "\n")
		}
	}
	return out.String()
}
