package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/leased/leased/api/leasepb"
)

// TestAuditLogFlag: --audit-log FILE puts the trail in the file and not on stderr; off writes it nowhere.
func TestAuditLogFlag(t *testing.T) {
	skipShort(t)
	for _, dest := range []string{"file", "off"} {
		t.Run(dest, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "audit.log")
			flag := file
			if dest == "off" {
				flag = "off"
			}
			addrs := freeAddrs(t, 3)
			client, peer, admin := addrs[0], addrs[1], addrs[2]
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			stderr := &syncBuffer{}
			args := []string{"--name=solo", "--data-dir=" + filepath.Join(dir, "solo"), "--client-addr=" + client,
				"--peer-addr=" + peer, "--admin-addr=" + admin, "--initial-cluster=solo=" + peer,
				"--election-timeout=50ms", "--audit-log=" + flag}
			done := make(chan error, 1)
			go func() { done <- run(ctx, args, env(), &bytes.Buffer{}, stderr) }()
			defer func() {
				cancel(errors.New("test stop"))
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			}()

			conn, err := grpc.NewClient(client, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			actx, acancel := context.WithTimeout(ctx, 10*time.Second)
			defer acancel()
			if _, err := leasepb.NewLeasesClient(conn).Acquire(actx, &leasepb.AcquireRequest{
				Resource: "audit/x", Holder: "h", TtlMs: 60_000}, grpc.WaitForReady(true)); err != nil {
				t.Fatal(err)
			}
			if dest == "file" {
				deadline := time.Now().Add(10 * time.Second)
				for b, _ := os.ReadFile(file); !strings.Contains(string(b), `msg="lease granted" node=solo event=granted resource=audit/x`); b, _ = os.ReadFile(file) {
					if time.Now().After(deadline) {
						t.Fatalf("no audit line in %s after 10s: %q", file, b)
					}
					time.Sleep(10 * time.Millisecond)
				}
			} else if _, err := os.Stat(file); err == nil {
				t.Errorf("--audit-log off created %s", file)
			}
			cancel(errors.New("test stop"))
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			done <- nil
			if strings.Contains(stderr.String(), "lease granted") {
				t.Errorf("the audit line went to stderr with --audit-log %s:\n%s", flag, stderr.String())
			}
		})
	}
}
