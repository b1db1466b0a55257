package chaos

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// artifactDir is where a run's history, summary, node logs and (on failure) porcupine's visualisation go:
// LEASED_CHAOS_OUT if set, else the test's artifact directory (kept with go test -artifacts).
func artifactDir(t *testing.T) string {
	if d := os.Getenv("LEASED_CHAOS_OUT"); d != "" {
		dir, err := os.MkdirTemp(d, t.Name()+"-")
		if err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.ArtifactDir()
}

// seedFromEnv returns LEASED_CHAOS_SEED, or a fresh seed (printed, so any run can be reproduced).
func seedFromEnv(t *testing.T) uint64 {
	if s := os.Getenv("LEASED_CHAOS_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LEASED_CHAOS_SEED: %v", err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// TestChaos is the fault-injection run. By default it is the short run of CI (about 40 s of faults,
// bounded); LEASED_CHAOS_DURATION makes it a soak. Every invariant must hold.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process chaos run: skipped with -short")
	}
	cfg := runConfig{
		Seed: seedFromEnv(t), Duration: 40 * time.Second,
		Workers: 6, Durable: 2, Hot: 3, Cold: 40, Epoch: 20 * time.Second, OpsPerWorker: 600, BatchGroups: 1,
		Nemeses: true, FullRestart: true, CheckTimeout: time.Minute,
		L1Holders: 4, Semaphore: 3, Gray: os.Getenv("LEASED_CHAOS_GRAY") == "1", Strict: os.Getenv("LEASED_CHAOS_STRICT") == "1",
		Plants: plantsFromEnv(), TLS: tlsFromEnv(), Membership: os.Getenv("LEASED_CHAOS_MEMBERSHIP") == "1",
		Flood: os.Getenv("LEASED_CHAOS_FLOOD") == "1", LogLevel: os.Getenv("LEASED_CHAOS_LOG_LEVEL"),
		DiskDamage: os.Getenv("LEASED_CHAOS_DISK") == "1",
		Wipe:       os.Getenv("LEASED_CHAOS_WIPE") == "1", PeerForge: os.Getenv("LEASED_CHAOS_PEERFORGE") == "1",
		DiskErr: os.Getenv("LEASED_CHAOS_DISKERR") == "1",
	}
	if s := os.Getenv("LEASED_CHAOS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("LEASED_CHAOS_DURATION: %v", err)
		}
		cfg.Duration, cfg.OpsPerWorker, cfg.CheckTimeout = d, 1<<30, 10*time.Minute
	}
	if s := os.Getenv("LEASED_CHAOS_NODES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || (n != 3 && n != 5) {
			t.Fatalf("LEASED_CHAOS_NODES=%q: want 3 or 5", s)
		}
		cfg.Nodes = n
	}
	t.Logf("seed %d (reproduce the schedule with LEASED_CHAOS_SEED=%d)", cfg.Seed, cfg.Seed)
	cfg.Bin = leasedBinary(t, "faultinject")
	rep := chaosRun(t, cfg, artifactDir(t))
	t.Log("\n" + rep.String())
	if n := rep.total(); n > 0 {
		t.Errorf("%d invariant violations (seed %d)", n, cfg.Seed)
	}
	if rep.Ops["acquire/ok"] == 0 || rep.Ops["release/ok"] == 0 || rep.Ops["get/ok"] == 0 {
		t.Errorf("the workload did too little: %v", rep.Ops)
	}
	if rep.Ops["batch-call/OK"] == 0 {
		t.Errorf("the batched workers sent no Writes request: their writes never reached the stream (%v)", rep.Ops)
	}
}

// TestCheckersCatchPlantedReleaseBug runs the workload against a server built with -tags plantbug, whose
// FSM releases a resource whatever token the Release names. Porcupine (I6) and the I1/I2 checker (a
// grant ended by a release of another token) must both report it, and so must the log checker (a
// release of a stale token answered OK, with no release of that token in its window).
func TestCheckersCatchPlantedReleaseBug(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run: skipped with -short")
	}
	cfg := runConfig{
		Seed: seedFromEnv(t), Duration: 8 * time.Second,
		Workers: 6, Hot: 2, Cold: 4, Epoch: time.Hour, OpsPerWorker: 300,
		CheckTimeout: 30 * time.Second,
	}
	cfg.Bin = leasedBinary(t, "plantbug,faultinject")
	rep := chaosRun(t, cfg, artifactDir(t))
	t.Log("\n" + rep.String())
	// Porcupine's model no longer sees this plant: a stale release answering OK is also what an
	// idempotent Release answers for a lease its holder released before, and the model lets leases expire
	// at will. The log checker sees exactly which release freed which token.
	if rep.Lin.Visual != "" {
		if _, err := os.Stat(rep.Lin.Visual); err != nil {
			t.Errorf("no visualisation written: %v", err)
		}
	}
	if len(rep.Violations["I1/I2"]) == 0 {
		t.Error("the I1/I2 checker did not catch the planted release bug")
	}
	if len(rep.Violations["log"]) == 0 {
		t.Error("the log checker did not catch the planted release bug (a RELEASED no release of that token made)")
	}
}

// TestL1CatchesPlantedGraySDK runs only the freeze-leader nemesis with the L1 holders on the gray-sdk
// planted client (legacyHolder: a KeepAlive stream without a watchdog, a first acquire attempt with the
// whole deadline). L1 must report leases lost and acquires of free resources stalled past the election
// timeout + 2 s while the other two nodes were a healthy majority.
func TestL1CatchesPlantedGraySDK(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run: skipped with -short")
	}
	cfg := runConfig{
		Seed: seedFromEnv(t), Duration: 25 * time.Second,
		Workers: 2, Hot: 2, Cold: 4, Epoch: time.Hour, OpsPerWorker: 300, CheckTimeout: 30 * time.Second,
		Schedule: "freeze", L1Holders: 4, Plants: plants{plantGraySDK},
	}
	cfg.Bin = leasedBinary(t, "faultinject")
	rep := chaosRun(t, cfg, artifactDir(t))
	t.Log("\n" + rep.String())
	f := rep.L1.Rows["freeze-leader"]
	switch {
	case f == nil || f.Injected == 0:
		t.Fatal("no freeze was injected")
	case f.Lost == 0:
		t.Error("L1 did not report the leases the stuck KeepAlive stream lost")
	case f.SlowAcquires == 0:
		t.Error("L1 did not report the acquires whose first attempt waited on the frozen leader")
	}
	if n := rep.total(); n > 0 {
		t.Errorf("%d safety violations: the plant is a liveness bug", n)
	}
}

// TestLogCheckerCatchesPlantedReleaseRetry runs the workload, without faults, with the
// release-lost-answer plant: a worker's release drops the first answer and reports its retry's
// NOT_FOUND. The log checker must report it (the release is in the log, inside the call's window);
// porcupine accepts the history, since its model lets the lease expire just before the release.
func TestLogCheckerCatchesPlantedReleaseRetry(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process run: skipped with -short")
	}
	cfg := runConfig{
		Seed: seedFromEnv(t), Duration: 8 * time.Second,
		Workers: 4, Hot: 2, Cold: 4, Epoch: time.Hour, OpsPerWorker: 300, CheckTimeout: 30 * time.Second,
		Plants: plants{plantReleaseRetry},
	}
	cfg.Bin = leasedBinary(t, "faultinject")
	rep := chaosRun(t, cfg, artifactDir(t))
	t.Log("\n" + rep.String())
	if len(rep.Violations["log-release"]) == 0 {
		t.Error("the log checker did not catch the planted NOT_FOUND after a release")
	}
	if len(rep.Violations["I6"]) != 0 {
		t.Errorf("porcupine rejected the history (%v): the plant was meant to be invisible to it", rep.Violations["I6"])
	}
}
