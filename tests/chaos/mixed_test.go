package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leased/leased/tests/internal/proc"
)

// The mixed-build mode (runConfig.Mixed; LEASED_CHAOS_MIXED=<git revision>, make chaos MIXED=<revision>)
// runs two builds of leased in one cluster, as a rolling upgrade does for a while: the build under test
// and another, built from a revision of this repository (MIXED=1 means proc.PreviousBuild). One node,
// picked by the seed, starts on the other build. The swap-build nemesis stops a node with SIGTERM, the way the
// upgrade runbook does, and starts it on the other build; it picks only nodes whose swap leaves both
// builds in the cluster, and the leader whenever it may, half of the time. Every other nemesis and
// checker runs over the mixed cluster as usual (the final full restart keeps each node's build).
//
// Its checker, "mixed": a node started on a build reports that build's version, and rejoins — it knows a
// leader and has applied what the rest had committed when it started — within rejoinTimeout. A node can
// only rejoin if raft messages flow both ways between the two builds, whichever of them leads.

// mixedFromEnv returns the revision LEASED_CHAOS_MIXED names ("1": proc.PreviousBuild), or "" (one build).
func mixedFromEnv() string {
	switch rev := os.Getenv("LEASED_CHAOS_MIXED"); rev {
	case "", "0":
		return ""
	case "1":
		return proc.PreviousBuild
	default:
		return rev
	}
}

// otherBuild builds leased, with the chaos runs' tags, at revision rev, and returns the binary and the
// version its nodes report (proc.NeedGitHistory).
func otherBuild(t testing.TB, rev string) (bin, version string) {
	t.Helper()
	proc.NeedGitHistory(t)
	version = "chaos-other-" + regexp.MustCompile(`[^A-Za-z0-9.]+`).ReplaceAllString(rev, "-")
	bin, err := proc.BuildRevision(buildDir, rev, "faultinject", version)
	if err != nil {
		t.Fatal(err)
	}
	return bin, version
}

// builds says which build each node index starts on. Its methods may be called from any goroutine.
type builds struct {
	other, version string // the other build's binary, and the version it reports

	mu      sync.Mutex
	onOther map[int]bool
}

// binary is proc.Config.NodeBin: the other build's binary for a node on it, else "" (the build under test).
func (b *builds) binary(i int) string {
	if b.on(i) {
		return b.other
	}
	return ""
}

func (b *builds) on(i int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.onOther[i]
}

func (b *builds) set(i int, other bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.onOther[i] = other
}

// swappable are the nodes of nodes whose swap leaves both builds in the cluster.
func (b *builds) swappable(nodes []int) []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	onOther := 0
	for _, i := range nodes {
		if b.onOther[i] {
			onOther++
		}
	}
	var out []int
	for _, i := range nodes {
		if (b.onOther[i] && onOther > 1) || (!b.onOther[i] && onOther < len(nodes)-1) {
			out = append(out, i)
		}
	}
	return out
}

// newBuilds starts one node of size, picked by the seed, on the other build.
func newBuilds(cfg runConfig, size int) *builds {
	first := rand.New(rand.NewPCG(cfg.Seed, 0xb11d)).IntN(size)
	return &builds{other: cfg.OtherBin, version: cfg.OtherVersion, onOther: map[int]bool{first: true}}
}

// checkStartBuilds checks every node of the freshly started cluster as the swap-build nemesis checks a
// node it started.
func (r *run) checkStartBuilds(ctx context.Context) {
	for i := range r.c.Nodes {
		r.checkBuild(ctx, i, r.waitRejoin(ctx, i, r.committedElsewhere(ctx, i)))
	}
}

// swapBuildNemesis restarts a node on the other build (see "The mixed-build mode" above).
func (r *run) swapBuildNemesis(ctx context.Context, rng *rand.Rand, ld int) {
	var live []int
	for i := range r.c.Nodes {
		if !r.removed[i] {
			live = append(live, i)
		}
	}
	can := r.builds.swappable(live)
	if len(can) == 0 {
		return
	}
	i := can[rng.IntN(len(can))]
	if slices.Contains(can, ld) && rng.IntN(2) == 0 {
		i = ld
	}
	toOther := !r.builds.on(i)
	id := r.faultStart(map[bool]string{true: "swap-build-leader", false: "swap-build-follower"}[i == ld], i)
	r.faultNote(id, nil, map[bool]string{true: "to " + r.builds.version, false: "to the build under test"}[toOther])
	r.stopNode(i)
	r.builds.set(i, toOther)
	commit := r.committedElsewhere(ctx, i)
	r.c.Start(i)
	r.checkBuild(ctx, i, r.waitRejoin(ctx, i, commit))
	r.faultEnd(id)
}

// checkBuild records a "mixed" finding unless node i rejoined (rejoinErr nil; an error of the workload's
// end is no finding) and reports the version of the build it was started on.
func (r *run) checkBuild(ctx context.Context, i int, rejoinErr error) {
	if ctx.Err() != nil {
		return
	}
	name, other := r.c.Nodes[i].Name, r.builds.on(i)
	build := map[bool]string{true: r.builds.version, false: "the build under test"}[other]
	var findings []string
	if rejoinErr != nil {
		findings = append(findings, fmt.Sprintf("%s, started on %s, did not rejoin: %v", name, build, rejoinErr))
	}
	if st, err := r.c.Status(ctx, i); err == nil && (st.GetVersion() == r.builds.version) != other {
		findings = append(findings, fmt.Sprintf("%s, started on %s, reports version %q", name, build, st.GetVersion()))
	}
	r.mu.Lock()
	r.mixedFindings = append(r.mixedFindings, findings...)
	r.mu.Unlock()
}

// TestMixedCatchesPlantedNoFallback runs, without faults, the build under test built with -tags
// plantoldpeer — it never falls back to the gRPC raft stream for a peer that serves only that — beside
// proc.PreviousBuild. The node on the previous build hears nothing from the others, and the mixed
// checker must say so.
func TestMixedCatchesPlantedNoFallback(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run: skipped with -short")
	}
	cfg := runConfig{
		Seed: seedFromEnv(t), Duration: 8 * time.Second,
		Workers: 2, Hot: 2, Cold: 4, Epoch: time.Hour, OpsPerWorker: 100, CheckTimeout: 30 * time.Second,
		Mixed: proc.PreviousBuild,
	}
	cfg.Bin = leasedBinary(t, "plantoldpeer,faultinject")
	cfg.OtherBin, cfg.OtherVersion = otherBuild(t, cfg.Mixed)
	rep := chaosRun(t, cfg, artifactDir(t))
	t.Log("\n" + rep.String())
	if len(rep.Violations["mixed"]) == 0 {
		t.Error("the mixed checker did not report the node the others never reached")
	}
}
