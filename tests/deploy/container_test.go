package deploy

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/tests/internal/proc"
)

// TestContainerImage builds the image from the repo's Dockerfile on a real Docker engine (scripts/docker.sh
// installs and starts one as root) and runs compose.yaml with it: three healthy containers, a lease taken
// through a published port with leasectl from the host, a SIGKILL of the leader's container that the
// lease survives, data kept across `docker-compose restart`, and the HTTP/JSON port serving.
//
// No container registry is reachable from the project's machines, so the test supplies the Dockerfile's
// base images (BUILD_IMAGE, RUNTIME_IMAGE) itself: a build base imported from this machine's Go toolchain,
// a shell and mkdir, and a runtime base holding only /etc/passwd, /etc/group and /tmp. Every other line
// of the Dockerfile runs as written (go mod download fetches from the module proxy).

// composePorts are the host ports compose.yaml publishes, for clients (7101-7103), the admin (7401-7403)
// and the HTTP/JSON API (7501-7503).
var composePorts = []int{7101, 7102, 7103, 7401, 7402, 7403, 7501, 7502, 7503}

const (
	buildBaseRepo = "leased-test/build-base"
	runtimeBase   = "leased-test/runtime-base:1"
	imageVersion  = "v0.0.0-containertest"
)

func TestContainerImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and runs containers: skipped with -short")
	}
	needEngine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	bases := localBases(ctx, t)
	bases["BUILD_IMAGE"] = withBuildCache(ctx, t, bases["BUILD_IMAGE"])
	image := fmt.Sprintf("leased-test/leased:%d", os.Getpid())
	build := []string{"build", "-t", image, "--build-arg", "VERSION=" + imageVersion}
	for arg, img := range bases {
		build = append(build, "--build-arg", arg+"="+img)
	}
	run(ctx, t, nil, "docker", append(build, "../..")...)
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", image).Run() })
	checkImage(ctx, t, image)

	c := upCompose(ctx, t, image)
	c.waitHealthy(ctx, "n1", "n2", "n3")
	ctl, err := proc.BuildCommand(t.TempDir(), "leasectl", "")
	if err != nil {
		t.Fatal(err)
	}
	leasectl := func(args ...string) string {
		return run(ctx, t, nil, ctl, append([]string{"--endpoints=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
			"--timeout=10s", "-o", "json"}, args...)...)
	}
	var grant struct {
		Token json.Number `json:"token"`
	}
	decodeJSON(t, leasectl("acquire", "deploy/container", "--ttl=5m", "--holder=container-test"), &grant)
	if grant.Token == "" {
		t.Fatal("acquire printed no token")
	}

	// SIGKILL the leader's container: the lease is committed on a quorum, so the two others keep it.
	leader := c.leader(ctx, ctl)
	run(ctx, t, nil, "docker", "kill", "--signal=KILL", c.container(ctx, leader))
	c.waitLease(ctx, ctl, "deploy/container", grant.Token, leader)
	c.compose(ctx, "start", leader)
	c.waitHealthy(ctx, "n1", "n2", "n3")

	// Restart every container: the lease comes back from the volumes.
	c.compose(ctx, "restart", "--timeout=20")
	c.waitHealthy(ctx, "n1", "n2", "n3")
	c.waitLease(ctx, ctl, "deploy/container", grant.Token, "")

	// The HTTP/JSON API answers on the published port, with the lease the gRPC port granted.
	var got struct {
		Lease struct {
			Holder string `json:"holder"`
		} `json:"lease"`
	}
	decodeJSON(t, httpGet(ctx, t, "http://127.0.0.1:7501/v1/leases/deploy/container"), &got)
	if got.Lease.Holder != "container-test" {
		t.Fatalf("GET /v1/leases/deploy/container on the HTTP port: holder %q, want container-test", got.Lease.Holder)
	}
}

// needEngine skips t, loudly, without a Docker engine and docker-compose — except under CI=true, where
// that fails t.
func needEngine(t *testing.T) {
	t.Helper()
	var missing []string
	if out, err := exec.Command("docker", "info").CombinedOutput(); err != nil {
		missing = append(missing, fmt.Sprintf("docker info: %v: %s", err, lastLine(out)))
	}
	if out, err := exec.Command("docker-compose", "version").CombinedOutput(); err != nil {
		missing = append(missing, fmt.Sprintf("docker-compose version: %v: %s", err, lastLine(out)))
	}
	if len(missing) == 0 {
		return
	}
	msg := "no Docker engine (run the tests through scripts/docker.sh, as scripts/test.sh does, as root): " +
		strings.Join(missing, "; ")
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip("SKIPPED: " + msg)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// run runs a command and returns its stdout; it fails t with its output if it fails.
func run(ctx context.Context, t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(ctx, env, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func runErr(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s%s", name, strings.Join(args, " "), err, tail(stdout.String()), tail(stderr.String()))
	}
	return stdout.String(), nil
}

// tail is the end of a long output.
func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}

func decodeJSON(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
}

func httpGet(ctx context.Context, t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// checkImage checks what the Dockerfile promises of the image: the version passed as a build argument,
// the nonroot user, the ports and the health check.
func checkImage(ctx context.Context, t *testing.T, image string) {
	t.Helper()
	version := run(ctx, t, nil, "docker", "run", "--rm", "--entrypoint=/usr/local/bin/leased", image, "--version")
	if !strings.Contains(version, imageVersion) {
		t.Errorf("leased --version in the image printed %q, want %s (the VERSION build argument)", version, imageVersion)
	}
	var cfg []struct {
		Config struct {
			User         string
			ExposedPorts map[string]any
			Healthcheck  *struct{ Test []string }
		}
	}
	decodeJSON(t, run(ctx, t, nil, "docker", "image", "inspect", image), &cfg)
	if len(cfg) != 1 {
		t.Fatalf("docker image inspect: %d images", len(cfg))
	}
	c := cfg[0].Config
	if c.User != "65532:65532" {
		t.Errorf("the image runs as %q, want 65532:65532", c.User)
	}
	for _, p := range []string{"7101/tcp", "7201/tcp", "7401/tcp", "7501/tcp"} {
		if _, ok := c.ExposedPorts[p]; !ok {
			t.Errorf("the image does not expose %s (it exposes %v)", p, c.ExposedPorts)
		}
	}
	if c.Healthcheck == nil || !strings.Contains(strings.Join(c.Healthcheck.Test, " "), "leased health") {
		t.Errorf("the image's health check is %+v, want leased health", c.Healthcheck)
	}
}

// localBases makes (or finds, from an earlier run) the base images the Dockerfile is built on here and
// returns them as build arguments.
func localBases(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	goroot := strings.TrimSpace(run(ctx, t, nil, "go", "env", "GOROOT"))
	goversion := strings.TrimSpace(run(ctx, t, nil, "go", "env", "GOVERSION"))
	gopath := strings.Split(strings.TrimSpace(run(ctx, t, nil, "go", "env", "GOPATH")), ":")[0]
	build := buildBaseRepo + ":" + strings.TrimPrefix(goversion, "go")
	if _, err := runErr(ctx, nil, "docker", "image", "inspect", build); err != nil {
		importImage(ctx, t, build, func(w *tar.Writer) error { return buildRootFS(w, goroot) },
			"ENV PATH=/usr/local/go/bin:/bin", "ENV GOPATH="+gopath, "ENV HOME=/root", "WORKDIR /")
	}
	if _, err := runErr(ctx, nil, "docker", "image", "inspect", runtimeBase); err != nil {
		importImage(ctx, t, runtimeBase, runtimeRootFS, "WORKDIR /")
	}
	return map[string]string{"BUILD_IMAGE": build, "RUNTIME_IMAGE": runtimeBase}
}

// withBuildCache returns base with a Go build cache at /root/.cache/go-build (the build stage's default)
// that holds the image's packages, compiled on this machine with the Dockerfile's settings (CGO_ENABLED=0,
// -trimpath), so the image builds in seconds rather than minutes. The cache is kept between runs under the
// user cache directory. It is valid in the container because the toolchain is this machine's, at the same
// GOROOT, with the same GOPATH, and -trimpath keeps directories out of what it is keyed on.
func withBuildCache(ctx context.Context, t *testing.T, base string) string {
	t.Helper()
	userCache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(userCache, "leased-tests", "docker-go-build")
	run(ctx, t, []string{"GOCACHE=" + cache, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false"},
		"go", "build", "-trimpath", "-o", t.TempDir()+"/", "../../cmd/leased", "../../cmd/leasectl")
	tag := fmt.Sprintf("%s-cached-%d", base, os.Getpid())
	cmd := exec.CommandContext(ctx, "docker", "build", "-t", tag, "-f", "-", cache)
	cmd.Stdin = strings.NewReader("FROM " + base + "\nCOPY . /root/.cache/go-build/\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker build %s: %v\n%s", tag, err, tail(string(out)))
	}
	t.Cleanup(func() {
		// The build stage leaves untagged images (the legacy builder keeps them as its layer cache), each
		// holding a copy of the cache: remove those made since this base, then the base.
		out, _ := exec.Command("docker", "images", "--quiet", "--filter=dangling=true", "--filter=since="+tag).Output()
		if ids := strings.Fields(string(out)); len(ids) > 0 {
			_ = exec.Command("docker", append([]string{"rmi", "-f"}, ids...)...).Run()
		}
		_ = exec.Command("docker", "rmi", "-f", tag).Run()
	})
	return tag
}

// importImage streams the tar archive that write makes into `docker import`.
func importImage(ctx context.Context, t *testing.T, tag string, write func(*tar.Writer) error, changes ...string) {
	t.Helper()
	args := []string{"import"}
	for _, c := range changes {
		args = append(args, "--change", c)
	}
	cmd := exec.CommandContext(ctx, "docker", append(args, "-", tag)...)
	pr, pw := io.Pipe()
	cmd.Stdin = pr
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(pw)
	werr := write(tw)
	if werr == nil {
		werr = tw.Close()
	}
	pw.CloseWithError(werr)
	if err := cmd.Wait(); err != nil || werr != nil {
		t.Fatalf("docker import %s: %v %v\n%s", tag, werr, err, out.String())
	}
}

// buildRootFS writes a root file system for the build stage: the Go toolchain at /usr/local/go, a /bin/sh
// and /bin/mkdir with the libraries they link, CA certificates (for the module proxy) and /tmp.
func buildRootFS(w *tar.Writer, goroot string) error {
	if err := addDir(w, "tmp", 0o1777); err != nil {
		return err
	}
	for img, host := range map[string]string{"bin/sh": "/bin/sh", "bin/mkdir": "/bin/mkdir",
		"etc/ssl/certs/ca-certificates.crt": "/etc/ssl/certs/ca-certificates.crt"} {
		if err := addFile(w, img, host); err != nil {
			return err
		}
	}
	libs, err := sharedLibs("/bin/sh", "/bin/mkdir")
	if err != nil {
		return err
	}
	for _, lib := range libs {
		if err := addFile(w, strings.TrimPrefix(lib, "/"), lib); err != nil {
			return err
		}
	}
	return filepath.WalkDir(goroot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(goroot, path)
		img := filepath.Join("usr/local/go", rel)
		switch {
		case d.IsDir():
			return addDir(w, img, 0o755)
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return w.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: img, Linkname: target, Mode: 0o777})
		default:
			return addFile(w, img, path)
		}
	})
}

// sharedLibs lists the libraries (and the dynamic loader) the binaries link, as ldd prints them.
func sharedLibs(bins ...string) ([]string, error) {
	out, err := exec.Command("ldd", bins...).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %v: %w", bins, err)
	}
	seen := map[string]bool{}
	var libs []string
	for _, m := range regexp.MustCompile(`(?m)(?:=> |^\s+)(/\S+)`).FindAllStringSubmatch(string(out), -1) {
		if !seen[m[1]] {
			seen[m[1]] = true
			libs = append(libs, m[1])
		}
	}
	return libs, nil
}

// runtimeRootFS writes a root file system like distroless's, less its CA certificates and time zones:
// /etc/passwd and /etc/group with root and nonroot (65532), /tmp and nonroot's home.
func runtimeRootFS(w *tar.Writer) error {
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
		"etc/group":  "root:x:0:\nnonroot:x:65532:\n",
	}
	for _, d := range []string{"etc", "tmp", "home", "home/nonroot"} {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, Uid: uidOf(d), Gid: uidOf(d)}); err != nil {
			return err
		}
	}
	for name, body := range files {
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}); err != nil {
			return err
		}
		if _, err := io.WriteString(w, body); err != nil {
			return err
		}
	}
	return nil
}

func uidOf(dir string) int {
	if dir == "home/nonroot" {
		return 65532
	}
	return 0
}

func addDir(w *tar.Writer, name string, mode int64) error {
	return w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode})
}

// addFile writes the host file (symbolic links followed) at name.
func addFile(w *tar.Writer, name, host string) error {
	f, err := os.Open(host)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(st.Mode().Perm()), Size: st.Size()}); err != nil {
		return err
	}
	_, err = io.Copy(w, f)
	return err
}

// composeRun is compose.yaml brought up as a project of its own.
type composeRun struct {
	t       *testing.T
	project string
	env     []string
}

// upCompose brings compose.yaml up with image, and registers its removal (containers, network, volumes).
func upCompose(ctx context.Context, t *testing.T, image string) *composeRun {
	t.Helper()
	for _, p := range composePorts {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			t.Fatalf("compose.yaml publishes 127.0.0.1:%d, which is in use (a local cluster?): %v", p, err)
		}
		l.Close()
	}
	c := &composeRun{t: t, project: fmt.Sprintf("leasedtest%d", os.Getpid()), env: []string{"LEASED_IMAGE=" + image}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			out, _ := runErr(ctx, c.env, "docker-compose", c.args("logs", "--no-color", "--tail=40")...)
			t.Logf("docker-compose logs:\n%s", out)
		}
		if _, err := runErr(ctx, c.env, "docker-compose", c.args("down", "--volumes", "--timeout=5")...); err != nil {
			t.Errorf("docker-compose down: %v", err)
		}
	})
	c.compose(ctx, "up", "--detach", "--no-build")
	return c
}

func (c *composeRun) args(args ...string) []string {
	return append([]string{"--file", composeFile, "--project-name", c.project}, args...)
}

func (c *composeRun) compose(ctx context.Context, args ...string) string {
	c.t.Helper()
	return run(ctx, c.t, c.env, "docker-compose", c.args(args...)...)
}

// container is the id of service's container.
func (c *composeRun) container(ctx context.Context, service string) string {
	c.t.Helper()
	id := strings.TrimSpace(c.compose(ctx, "ps", "--quiet", service))
	if id == "" {
		c.t.Fatalf("no container for %s", service)
	}
	return id
}

// waitHealthy waits until the services' containers run and report healthy (the image's health check:
// leased health, 200 from /readyz).
func (c *composeRun) waitHealthy(ctx context.Context, services ...string) {
	c.t.Helper()
	var last string
	err := proc.Poll(2*time.Minute, func() bool {
		for _, s := range services {
			id, err := runErr(ctx, c.env, "docker-compose", c.args("ps", "--quiet", s)...)
			if err != nil || strings.TrimSpace(id) == "" {
				last = fmt.Sprintf("%s: no container (%v)", s, err)
				return false
			}
			out, err := runErr(ctx, nil, "docker", "inspect", "--format={{.State.Status}} {{.State.Health.Status}}", strings.TrimSpace(id))
			if err != nil || strings.TrimSpace(out) != "running healthy" {
				last = fmt.Sprintf("%s: %q %v", s, strings.TrimSpace(out), err)
				return false
			}
		}
		return true
	})
	if err != nil {
		c.t.Fatalf("the containers are not healthy: %v (last: %s)", err, last)
	}
}

// leader is the service whose node leads, as leasectl status reports it.
func (c *composeRun) leader(ctx context.Context, ctl string) string {
	c.t.Helper()
	var name string
	err := proc.Poll(time.Minute, func() bool {
		out, _ := runErr(ctx, nil, ctl, "--endpoints=127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103", "--timeout=3s", "status", "-o", "json")
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var st struct {
				Name string `json:"name"`
				Role string `json:"role"`
			}
			if json.Unmarshal([]byte(line), &st) == nil && st.Role == "leader" {
				name = st.Name
				return true
			}
		}
		return false
	})
	if err != nil {
		c.t.Fatalf("no leader in leasectl status: %v", err)
	}
	return name
}

// waitLease waits until resource is held with token, asked through the nodes other than skip.
func (c *composeRun) waitLease(ctx context.Context, ctl, resource string, token json.Number, skip string) {
	c.t.Helper()
	var eps []string
	for i, s := range []string{"n1", "n2", "n3"} {
		if s != skip {
			eps = append(eps, fmt.Sprintf("127.0.0.1:%d", 7101+i))
		}
	}
	var last string
	err := proc.Poll(time.Minute, func() bool {
		out, err := runErr(ctx, nil, ctl, "--endpoints="+strings.Join(eps, ","), "--timeout=3s", "-o", "json", "get", resource)
		var got struct {
			Token json.Number `json:"token"`
		}
		last = fmt.Sprintf("%s %v", strings.TrimSpace(out), err)
		return err == nil && json.Unmarshal([]byte(strings.TrimSpace(out)), &got) == nil && got.Token == token
	})
	if err != nil {
		c.t.Fatalf("%s is not held with token %s through %v: %v (last: %s)", resource, token, eps, err, last)
	}
}
