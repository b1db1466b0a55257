package chaos

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestRecheckHistory re-checks a saved run: LEASED_CHAOS_RECHECK=<artifact dir> reads its
// history.jsonl, checks each resource on its own, and for every resource that is not linearizable
// prints its operations (in call order, times in seconds from the start of the run) and its applied
// events from events.txt. Skipped without the variable.
func TestRecheckHistory(t *testing.T) {
	dir := os.Getenv("LEASED_CHAOS_RECHECK")
	if dir == "" {
		t.Skip("LEASED_CHAOS_RECHECK=<artifact dir> re-checks a saved run")
	}
	ops := readHistory(t, filepath.Join(dir, "history.jsonl"))
	model := leaseModel.ToModel()
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
		t.Errorf("%s is not linearizable; its operations:\n%s\nits events:\n%s", res, b.String(), grepEvents(t, filepath.Join(dir, "events.txt"), res))
	}
}

func describeOp(o op) string {
	d := leaseModel.DescribeOperation(o.In, o.Out)
	ret := "?"
	if o.Out.Out != outUnknown {
		ret = time.Duration(o.Return).String()
	}
	return time.Duration(o.Call).String() + " .. " + ret + "  client " + itoa(o.Client) + " attempt " + itoa(o.Attempt) + ": " + d
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

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

func grepEvents(t *testing.T, path, res string) string {
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
