package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/tests/internal/proc"
)

// configFileExample is the first line of docs/operations.md's example --config-file.
const configFileExample = "# leased.yaml\n"

// TestConfigFileExample starts a node with the --config-file of docs/operations.md, "Configuration file",
// and sees the limit the file sets enforced: one holder gets max-leases-per-holder leases, and the next
// is refused with ResourceExhausted naming the flag. (The file's election-timeout is overridden by the
// test clusters' own on the command line, which wins.)
func TestConfigFileExample(t *testing.T) {
	var example string
	for _, b := range codeBlocks(readDoc(t, "docs/operations.md"), "yaml") {
		if strings.HasPrefix(b, configFileExample) {
			example = b
		}
	}
	var settings struct {
		PerHolder int `yaml:"max-leases-per-holder"`
	}
	if err := yaml.Unmarshal([]byte(example), &settings); err != nil || settings.PerHolder < 1 || settings.PerHolder > 1000 {
		t.Fatalf("docs/operations.md has no yaml block starting %q that sets max-leases-per-holder to 1..1000 (%v):\n%s",
			configFileExample, err, example)
	}
	path := filepath.Join(t.TempDir(), "leased.yaml")
	if err := os.WriteFile(path, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 1, "--config-file="+path)
	r := newRetrier(c, 0)
	for i := range settings.PerHolder {
		if _, _, err := r.acquire(fmt.Sprintf("jobs/%d", i), "worker", fmt.Sprintf("req-%d", i), 30*time.Second); err != nil {
			t.Fatalf("acquire %d of %d: %v", i+1, settings.PerHolder, err)
		}
	}
	_, _, err := r.acquire("jobs/one-more", "worker", "req-more", 30*time.Second)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--max-leases-per-holder") {
		t.Fatalf("lease %d of one holder: %v, want ResourceExhausted naming --max-leases-per-holder", settings.PerHolder+1, err)
	}
}

// TestConfigFileTypoExitsTwo: a key that names no flag stops the binary with exit status 2 and a message
// naming the file, the line and the key, before it creates the data dir.
func TestConfigFileTypoExitsTwo(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "leased.yaml")
	if err := os.WriteFile(path, []byte("max-leases: 100\nmax-leases-per-hodler: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	peer := proc.FreeAddrs(t, 1)[0]
	data := filepath.Join(dir, "data")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, leasedBin, "--name=solo", "--data-dir="+data, "--peer-addr="+peer,
		"--admin-addr=", "--initial-cluster=solo="+peer, "--config-file="+path).CombinedOutput()
	var exit *exec.ExitError
	want := fmt.Sprintf(`config file %s: line 2: unknown key "max-leases-per-hodler"`, path)
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), want) {
		t.Fatalf("a typo in the config file: %v, want exit 2 and %q:\n%s", err, want, out)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the data dir exists after a refused config file: %v", err)
	}
}
