package e2e

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// versionOf runs bin with args (and extra environment) and returns its first output line, failing on a
// non-zero exit.
func versionOf(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	}
	return strings.SplitN(string(out), "\n", 2)[0]
}

// TestVersionsAgree: leased --version, leasectl version and the Go build information agree (both
// binaries were built with go build, as make build and the Dockerfile do), LEASED_VERSION in the
// environment changes nothing, and -ldflags -X overrides the version.
func TestVersionsAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test: skipped with -short")
	}
	line := versionOf(t, leasedBin, nil, "--version")
	if got := versionOf(t, leasedBin, []string{"LEASED_VERSION=v1.2.3"}, "--version"); got != line {
		t.Fatalf("LEASED_VERSION=v1.2.3 leased --version printed %q, want %q", got, line)
	}
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != "leased" {
		t.Fatalf("leased --version printed %q", line)
	}
	version := fields[1]
	var ctl struct {
		Version  string `json:"version"`
		Revision string `json:"revision"`
	}
	if err := json.Unmarshal([]byte(versionOf(t, leasectlBin, nil, "version", "-o", "json")), &ctl); err != nil {
		t.Fatal(err)
	}
	if ctl.Version != version {
		t.Fatalf("leasectl version says %q, leased --version %q", ctl.Version, version)
	}
	out, err := exec.Command("go", "version", "-m", leasedBin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/leased/leased" {
			if want := f[2]; want != version && !(want == "(devel)" && version == "devel") {
				t.Fatalf("the build information says %q, leased --version %q", want, version)
			}
		}
	}

	bin := filepath.Join(t.TempDir(), "leased-ldflags")
	build := exec.Command("go", "build", "-o", bin, "-ldflags",
		"-X github.com/leased/leased/cmd/internal/buildinfo.version=v9.8.7-test", "github.com/leased/leased/cmd/leased")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags: %v\n%s", err, out)
	}
	if got := versionOf(t, bin, nil, "--version"); !strings.HasPrefix(got, "leased v9.8.7-test (") {
		t.Fatalf("built with -X ...version=v9.8.7-test, --version printed %q", got)
	}
}

// TestHealthCommand: `leased health` exits 0 against a ready node, 1 once it is gone.
func TestHealthCommand(t *testing.T) {
	c := newCluster(t, 1)
	admin := c.Nodes[0].AdminAddr
	health := func() (int, string) {
		out, err := exec.Command(leasedBin, "health", "--admin-addr", admin, "--timeout", "1s").CombinedOutput()
		if exit, ok := err.(*exec.ExitError); ok {
			return exit.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	c.eventually(10*time.Second, "leased health to pass", func() bool { code, _ := health(); return code == 0 })
	c.Kill(0)
	if code, out := health(); code != 1 || !strings.Contains(out, "leased: health: /readyz") {
		t.Fatalf("health of a killed node: exit %d, %q", code, out)
	}
}
