package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
)

var _ quotaReporter = (*server.Server)(nil)

// TestQuotaBytesEndToEnd runs leased with a --quota-bytes of about a dozen small leases and fills it:
// the grant that finds the state at the quota is refused with ResourceExhausted naming --quota-bytes,
// /readyz (still 200) and leased_quota_exceeded report the NOSPACE alarm, a renewal and a release still
// work, and the release clears the alarm so that the next grant succeeds.
func TestQuotaBytesEndToEnd(t *testing.T) {
	skipShort(t)
	addrs := freeAddrs(t, 3)
	peer, admin, client := addrs[0], addrs[1], addrs[2]
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	stderr := &syncBuffer{}
	args := []string{
		"--name=solo", "--data-dir=" + filepath.Join(t.TempDir(), "solo"), "--client-addr=" + client,
		"--peer-addr=" + peer, "--admin-addr=" + admin, "--initial-cluster=solo=" + peer,
		"--election-timeout=50ms", "--quota-bytes=2000",
	}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(), &bytes.Buffer{}, stderr) }()
	defer func() {
		cancel(errors.New("test stop"))
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	conn, err := grpc.NewClient(client, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	leases := leasepb.NewLeasesClient(conn)
	acquire := func(i int) (*leasepb.AcquireResponse, error) {
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		return leases.Acquire(cctx, &leasepb.AcquireRequest{Resource: fmt.Sprintf("q/%03d", i), Holder: "h", TtlMs: 60_000, Value: []byte("0123456789")})
	}
	// Wait for the node to lead (Unavailable until then).
	var first *leasepb.AcquireResponse
	deadline := time.Now().Add(10 * time.Second)
	for first, err = acquire(0); status.Code(err) == codes.Unavailable; first, err = acquire(0) {
		if time.Now().After(deadline) {
			t.Fatalf("no leader: %v\n%s", err, stderr.String())
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	granted := []*leasepb.Lease{first.GetLease()}
	var refusal error
	for i := 1; i < 100 && refusal == nil; i++ {
		resp, err := acquire(i)
		switch {
		case status.Code(err) == codes.ResourceExhausted:
			refusal = err
		case err != nil:
			t.Fatalf("acquire %d: %v", i, err)
		default:
			granted = append(granted, resp.GetLease())
		}
	}
	if refusal == nil {
		t.Fatal("100 grants under a 2000-byte quota: none refused")
	}
	st := status.Convert(refusal)
	if !strings.Contains(st.Message(), "--quota-bytes") || quotaSubject(st) != "--quota-bytes" {
		t.Fatalf("refusal %v (details %v): want ResourceExhausted naming --quota-bytes", refusal, st.Details())
	}
	t.Logf("%d grants, then: %s", len(granted), st.Message())

	readyz := fetch(t, "http://"+admin+"/readyz")
	if !strings.Contains(readyz, "alarm: NOSPACE") || !strings.Contains(readyz, "--quota-bytes") {
		t.Fatalf("/readyz at the quota says %q", readyz)
	}
	if m := fetch(t, "http://"+admin+"/metrics"); !strings.Contains(m, "leased_quota_exceeded 1") || !strings.Contains(m, "leased_quota_bytes 2000") {
		t.Fatalf("/metrics at the quota lacks leased_quota_exceeded 1 or leased_quota_bytes 2000")
	}

	// Renewals, reads and releases go on.
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	if _, err := leases.Renew(cctx, &leasepb.RenewRequest{Resource: granted[0].GetResource(), Token: granted[0].GetToken()}); err != nil {
		t.Fatalf("renew at the quota: %v", err)
	}
	if _, err := leases.Get(cctx, &leasepb.GetRequest{Resource: granted[0].GetResource()}); err != nil {
		t.Fatalf("get at the quota: %v", err)
	}
	// A retry of a grant already made is answered with it, not refused.
	last := granted[len(granted)-1]
	if _, err := leases.Acquire(cctx, &leasepb.AcquireRequest{Resource: last.GetResource(), Holder: "h", TtlMs: 60_000, Value: []byte("0123456789")}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("acquire of a held resource at the quota: %v, want the held answer", err)
	}
	for _, l := range granted[:2] {
		if _, err := leases.Release(cctx, &leasepb.ReleaseRequest{Resource: l.GetResource(), Token: l.GetToken()}); err != nil {
			t.Fatalf("release at the quota: %v", err)
		}
	}
	if readyz := fetch(t, "http://"+admin+"/readyz"); strings.Contains(readyz, "alarm") {
		t.Fatalf("/readyz after releases says %q", readyz)
	}
	if m := fetch(t, "http://"+admin+"/metrics"); !strings.Contains(m, "leased_quota_exceeded 0") {
		t.Fatal("/metrics after releases lacks leased_quota_exceeded 0")
	}
	if _, err := acquire(500); err != nil {
		t.Fatalf("grant after the release cleared the alarm: %v", err)
	}
}

func quotaSubject(st *status.Status) string {
	for _, d := range st.Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.GetViolations()) > 0 {
			return q.GetViolations()[0].GetSubject()
		}
	}
	return ""
}
