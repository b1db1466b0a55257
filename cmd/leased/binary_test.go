package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
)

// TestBinaryServesMetricsAndAuditTrail builds the real leased binary, runs a one-node cluster with it
// (--log-format json), and finds leased_build_info (with the Go version) and the gRPC server metrics on
// the admin port's /metrics, a grant's audit line, as JSON, in its log, and the grant on the HTTP/JSON
// port (--http-addr). It runs under a GOMEMLIMIT without GOGC, which leased leaves at the runtime's
// 100 (it sets no GOGC of its own), and its start-up line says so.
func TestBinaryServesMetricsAndAuditTrail(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "leased")
	gocmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	if out, err := exec.Command(gocmd, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build leased: %v\n%s", err, out)
	}
	addrs := freeAddrs(t, 4)
	client, peer, admin, httpAddr := addrs[0], addrs[1], addrs[2], addrs[3]
	stderr := &syncBuffer{}
	cmd := exec.Command(bin, "--name=solo", "--data-dir="+filepath.Join(dir, "solo"), "--client-addr="+client,
		"--peer-addr="+peer, "--admin-addr="+admin, "--http-addr="+httpAddr, "--initial-cluster=solo="+peer, "--election-timeout=100ms", "--log-format=json")
	cmd.Stderr = stderr
	cmd.Env = append(withoutEnv(os.Environ(), "GOGC", "GOMEMLIMIT"), "GOMEMLIMIT=1GiB")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("leased exited with %v on SIGTERM\n%s", err, stderr.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("leased did not exit on SIGTERM")
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), `"msg":"became leader"`) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("leased exited early: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader after 20s:\n%s", stderr.String())
		}
	}

	if log := stderr.String(); !strings.Contains(log, `"gogc":100,"memory_limit":"1073741824"`) {
		t.Errorf("the start-up line does not say GOGC=100 under GOMEMLIMIT=1GiB:\n%s", log)
	}

	conn, err := grpc.NewClient(client, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := leasepb.NewLeasesClient(conn).Acquire(ctx, &leasepb.AcquireRequest{Resource: "bin/audit", Holder: "tester", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}

	token := strconv.FormatUint(resp.GetLease().GetToken(), 10)
	if got := fetch(t, "http://"+httpAddr+"/v1/leases/bin/audit"); !strings.Contains(got, `"token":"`+token+`"`) {
		t.Errorf("GET /v1/leases/bin/audit on --http-addr answered %s, want token %s", got, token)
	}

	metrics := fetch(t, "http://"+admin+"/metrics")
	for _, want := range []string{
		`leased_build_info{goversion="` + runtime.Version() + `",revision="`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Acquire",grpc_service="leased.v1.Leases",grpc_type="unary"} 1`,
		`leased_events_total{type="granted"} 1`,
		"\ngo_gc_gogc_percent 100\n", // the runtime's own view: leased set no GOGC
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "leased_build_info{") && !strings.HasSuffix(line, "} 1") {
			t.Errorf("build info %q is not 1", line)
		}
	}
	want := `"msg":"lease granted","node":"solo","event":"granted","resource":"bin/audit","token":` +
		strconv.FormatUint(resp.GetLease().GetToken(), 10) + `,"holder":"tester"`
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(stderr.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no audit line %s in the log:\n%s", want, stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// withoutEnv returns env without the variables named.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(names, name) {
			out = append(out, kv)
		}
	}
	return out
}
