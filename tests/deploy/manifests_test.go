package deploy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/leased/leased/tests/internal/proc"
)

// The deployment files — deploy/kubernetes, deploy/systemd, compose.yaml, the Dockerfile — configure
// leased through LEASED_* variables and --flags. These tests check that they parse and that every one
// of them names a flag the built binary's --help-all lists, so renaming a flag fails here, not in a rollout.

const (
	kubernetesDir = "../../deploy/kubernetes"
	systemdUnit   = "../../deploy/systemd/leased.service"
	composeFile   = "../../compose.yaml"
	dockerfile    = "../../Dockerfile"
)

// pendingFlags are flags the deployment files may set ahead of the code that adds them. leased ignores
// a LEASED_* variable that names no flag, so the files work before and after. Once a flag exists the test fails until it is
// removed from here, so this list only ever shrinks to nothing.
var pendingFlags = map[string]string{}

// adminRoutes are the admin HTTP server's paths that probes may ask (cmd/leased/admin.go; the e2e tests
// exercise them on real processes).
var adminRoutes = []string{"/healthz", "/readyz", "/metrics"}

// leasedFlags builds cmd/leased and returns the flags its --help-all lists, and the binary.
func leasedFlags(t *testing.T) (map[string]bool, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary: skipped with -short")
	}
	bin, err := proc.Build(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "--help-all").Output()
	if err != nil {
		t.Fatalf("leased --help-all: %v", err)
	}
	flags := map[string]bool{}
	re := regexp.MustCompile(`^  --([a-z0-9-]+)`)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = true
		}
	}
	if len(flags) < 10 || !flags["initial-cluster"] {
		t.Fatalf("found only %v in leased --help-all", flags)
	}
	return flags, bin
}

// flagOfEnv is the flag a LEASED_* variable sets ("" for other variables).
func flagOfEnv(name string) string {
	rest, ok := strings.CutPrefix(name, "LEASED_")
	if !ok {
		return ""
	}
	return strings.ReplaceAll(strings.ToLower(rest), "_", "-")
}

// checkFlags reports every referenced flag leased does not know (and pending flags it does know).
func checkFlags(t *testing.T, where string, known map[string]bool, referenced []string) {
	t.Helper()
	if len(referenced) == 0 {
		t.Errorf("%s sets no leased flag at all (the parser missed them?)", where)
	}
	for _, f := range referenced {
		switch _, pending := pendingFlags[f]; {
		case known[f] && pending:
			t.Errorf("%s: --%s exists now: remove it from pendingFlags", where, f)
		case !known[f] && !pending:
			t.Errorf("%s sets --%s, which leased --help-all does not list", where, f)
		}
	}
}

// k8sObject is the part of a Kubernetes object these checks read.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec yaml.Node         `yaml:"spec"`
	Data map[string]string `yaml:"data"` // a ConfigMap's
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type statefulSetSpec struct {
	ServiceName         string `yaml:"serviceName"`
	Replicas            int    `yaml:"replicas"`
	PodManagementPolicy string `yaml:"podManagementPolicy"`
	Selector            struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec struct {
			Containers []container `yaml:"containers"`
			Volumes    []struct {
				Name   string `yaml:"name"`
				Secret *struct {
					SecretName string `yaml:"secretName"`
				} `yaml:"secret"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
	VolumeClaimTemplates []struct {
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
	} `yaml:"volumeClaimTemplates"`
}

type serviceSpec struct {
	ClusterIP                string            `yaml:"clusterIP"`
	PublishNotReadyAddresses bool              `yaml:"publishNotReadyAddresses"`
	Selector                 map[string]string `yaml:"selector"`
}

type pdbSpec struct {
	MaxUnavailable int `yaml:"maxUnavailable"`
	Selector       struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
}

// loadKubernetes parses every document of every YAML file in deploy/kubernetes.
func loadKubernetes(t *testing.T) []k8sObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", kubernetesDir, err)
	}
	var objs []k8sObject
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var o k8sObject
			if err := dec.Decode(&o); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if filepath.Base(f) == "kustomization.yaml" {
				continue
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Fatalf("%s: a document without apiVersion, kind or metadata.name", f)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

func decodeSpec[T any](t *testing.T, o k8sObject) T {
	t.Helper()
	var spec T
	if err := o.Spec.Decode(&spec); err != nil {
		t.Fatalf("%s %s: %v", o.Kind, o.Metadata.Name, err)
	}
	return spec
}

func TestKubernetesManifests(t *testing.T) {
	known, _ := leasedFlags(t)
	byKind := map[string][]k8sObject{}
	for _, o := range loadKubernetes(t) {
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	if len(byKind["StatefulSet"]) != 1 || len(byKind["Service"]) != 2 || len(byKind["PodDisruptionBudget"]) != 1 {
		t.Fatalf("want one StatefulSet, two Services and one PodDisruptionBudget, got %v", byKind)
	}
	sts := decodeSpec[statefulSetSpec](t, byKind["StatefulSet"][0])
	if sts.Replicas != 3 || sts.PodManagementPolicy != "Parallel" {
		t.Errorf("StatefulSet: replicas %d, podManagementPolicy %q; want 3 and Parallel", sts.Replicas, sts.PodManagementPolicy)
	}
	labels := sts.Template.Metadata.Labels
	if len(sts.Selector.MatchLabels) == 0 || !subset(sts.Selector.MatchLabels, labels) {
		t.Errorf("StatefulSet selector %v does not select its pods %v", sts.Selector.MatchLabels, labels)
	}
	headless := false
	for _, o := range byKind["Service"] {
		svc := decodeSpec[serviceSpec](t, o)
		if !subset(svc.Selector, labels) || len(svc.Selector) == 0 {
			t.Errorf("Service %s selects %v, not the pods %v", o.Metadata.Name, svc.Selector, labels)
		}
		if o.Metadata.Name == sts.ServiceName {
			headless = svc.ClusterIP == "None" && svc.PublishNotReadyAddresses
		}
	}
	if !headless {
		t.Errorf("the StatefulSet's service %q is not headless with publishNotReadyAddresses", sts.ServiceName)
	}
	pdb := decodeSpec[pdbSpec](t, byKind["PodDisruptionBudget"][0])
	if pdb.MaxUnavailable != 1 || !subset(pdb.Selector.MatchLabels, labels) {
		t.Errorf("PodDisruptionBudget: maxUnavailable %d, selector %v", pdb.MaxUnavailable, pdb.Selector.MatchLabels)
	}

	if len(sts.Template.Spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(sts.Template.Spec.Containers))
	}
	c := sts.Template.Spec.Containers[0]
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes: readiness %+v, liveness %+v; want /readyz and /healthz", c.ReadinessProbe, c.LivenessProbe)
	}
	for _, p := range []*probe{c.ReadinessProbe, c.LivenessProbe} {
		if p != nil && !slices.Contains(adminRoutes, p.HTTPGet.Path) {
			t.Errorf("probe asks %s, which the admin server does not serve", p.HTTPGet.Path)
		}
	}
	var referenced []string
	env := map[string]string{}
	for _, e := range c.Env {
		// $(VAR) expands only variables defined earlier in the list.
		for _, m := range regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`).FindAllStringSubmatch(e.Value, -1) {
			if _, ok := env[m[1]]; !ok {
				t.Errorf("%s refers to $(%s), not defined before it", e.Name, m[1])
			}
		}
		env[e.Name] = e.Value
		if f := flagOfEnv(e.Name); f != "" {
			referenced = append(referenced, f)
		}
	}
	referenced = append(referenced, argFlags(c.Args)...)
	checkFlags(t, "statefulset.yaml", known, referenced)

	// --initial-cluster names every pod by its headless-Service name, and the data dir is the volume.
	var want []string
	for i := range sts.Replicas {
		pod := byKind["StatefulSet"][0].Metadata.Name + "-" + string(rune('0'+i))
		want = append(want, pod+"="+pod+"."+sts.ServiceName+":7201")
	}
	if got := env["LEASED_INITIAL_CLUSTER"]; got != strings.Join(want, ",") {
		t.Errorf("LEASED_INITIAL_CLUSTER = %q, want %q", got, strings.Join(want, ","))
	}
	// A pod whose volume is lost comes back with its founding flags on an empty data dir: it must rejoin
	// under a new raft id rather than refuse to start (docs/operations.md, "Replace a failed node").
	if env["LEASED_AUTO_REJOIN"] != "true" {
		t.Errorf("LEASED_AUTO_REJOIN = %q, want \"true\"", env["LEASED_AUTO_REJOIN"])
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if len(sts.VolumeClaimTemplates) != 1 || mounts[env["LEASED_DATA_DIR"]] != sts.VolumeClaimTemplates[0].Metadata.Name {
		t.Errorf("the data dir %q is not the volume claim's mount (%v)", env["LEASED_DATA_DIR"], mounts)
	}
	for _, name := range []string{"LEASED_CERT_FILE", "LEASED_KEY_FILE", "LEASED_TRUSTED_CA_FILE", "LEASED_PEER_CERT_FILE"} {
		dir := filepath.Dir(env[name])
		if vol := mounts[dir]; vol == "" || !secretVolume(sts, vol) {
			t.Errorf("%s = %q is not in a mounted Secret", name, env[name])
		}
	}
}

func secretVolume(sts statefulSetSpec, name string) bool {
	for _, v := range sts.Template.Spec.Volumes {
		if v.Name == name && v.Secret != nil && v.Secret.SecretName != "" {
			return true
		}
	}
	return false
}

func subset(sub, of map[string]string) bool {
	for k, v := range sub {
		if of[k] != v {
			return false
		}
	}
	return true
}

// argFlags returns the flag names in a command line ("--name=x" and "--name x").
func argFlags(args []string) []string {
	var out []string
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			out = append(out, name)
		}
	}
	return out
}

type composeService struct {
	Image       string            `yaml:"image"`
	Environment map[string]string `yaml:"environment"`
	Command     []string          `yaml:"command"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

func TestComposeFile(t *testing.T) {
	known, bin := leasedFlags(t)
	b, err := os.ReadFile(composeFile)
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Services) != 3 {
		t.Fatalf("want three services, got %d", len(f.Services))
	}
	images := map[string]bool{}
	var referenced []string
	for name, s := range f.Services {
		images[s.Image] = true
		if s.Environment["LEASED_NAME"] != name {
			t.Errorf("service %s runs node %q", name, s.Environment["LEASED_NAME"])
		}
		for _, v := range []string{"LEASED_ADVERTISE_CLIENT_ADDR", "LEASED_ADVERTISE_PEER_ADDR"} {
			if host, _, _ := strings.Cut(s.Environment[v], ":"); host != name {
				t.Errorf("service %s: %s = %q, want its service name", name, v, s.Environment[v])
			}
		}
		for k := range s.Environment {
			if fl := flagOfEnv(k); fl != "" {
				referenced = append(referenced, fl)
			}
		}
		referenced = append(referenced, argFlags(s.Command)...)
		checkHealthcheck(t, "compose service "+name, bin, s.Healthcheck.Test)
	}
	if len(images) != 1 {
		t.Errorf("the services use %d images, want one shared image", len(images))
	}
	checkFlags(t, "compose.yaml", known, referenced)
}

// checkHealthcheck checks a health check runs `leased health` (with flags leased health knows).
func checkHealthcheck(t *testing.T, where, bin string, test []string) {
	t.Helper()
	if len(test) < 3 || test[0] != "CMD" || filepath.Base(test[1]) != "leased" || test[2] != "health" {
		t.Errorf("%s: health check %v, want [CMD .../leased health ...]", where, test)
		return
	}
	out, err := exec.Command(bin, "health", "--help").Output()
	if err != nil {
		t.Fatalf("leased health --help: %v", err)
	}
	for _, f := range argFlags(test[3:]) {
		if !strings.Contains(string(out), "--"+f+"\n") {
			t.Errorf("%s: leased health has no --%s", where, f)
		}
	}
}

func TestDockerfile(t *testing.T) {
	known, bin := leasedFlags(t)
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	var referenced []string
	for _, m := range regexp.MustCompile(`\b(LEASED_[A-Z0-9_]+)=`).FindAllStringSubmatch(text, -1) {
		referenced = append(referenced, flagOfEnv(m[1]))
	}
	checkFlags(t, "Dockerfile", known, referenced)
	m := regexp.MustCompile(`(?m)^HEALTHCHECK .* CMD (\[.*\])$`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("the Dockerfile has no HEALTHCHECK ... CMD [...]")
	}
	var cmd []string
	if err := yaml.Unmarshal([]byte(m[1]), &cmd); err != nil {
		t.Fatalf("HEALTHCHECK CMD %s: %v", m[1], err)
	}
	checkHealthcheck(t, "Dockerfile", bin, append([]string{"CMD"}, cmd...))
	if !strings.Contains(text, "cmd/internal/buildinfo.version=") {
		t.Error("the Dockerfile does not pass VERSION the way make build does (-X .../buildinfo.version)")
	}
}

func TestSystemdUnit(t *testing.T) {
	known, _ := leasedFlags(t)
	b, err := os.ReadFile(systemdUnit)
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("not a unit file line: %q", line)
			}
			keys[section+k] = append(keys[section+k], v)
		}
	}
	for k, want := range map[string]string{
		"[Service]Restart": "on-failure", "[Service]DynamicUser": "yes", "[Service]StateDirectory": "leased",
		"[Service]NoNewPrivileges": "yes", "[Service]ProtectSystem": "strict", "[Install]WantedBy": "multi-user.target",
	} {
		if !slices.Contains(keys[k], want) {
			t.Errorf("%s = %v, want %s", k, keys[k], want)
		}
	}
	if len(keys["[Service]LimitNOFILE"]) != 1 {
		t.Error("no LimitNOFILE")
	}
	var referenced []string
	for _, v := range keys["[Service]Environment"] {
		name, _, _ := strings.Cut(v, "=")
		referenced = append(referenced, flagOfEnv(name))
	}
	exec := keys["[Service]ExecStart"]
	if len(exec) != 1 || !strings.HasSuffix(strings.Fields(exec[0])[0], "/leased") {
		t.Fatalf("ExecStart = %v", exec)
	}
	referenced = append(referenced, argFlags(strings.Fields(exec[0]))...)
	if !slices.Contains(referenced, "data-dir") {
		t.Error("the unit does not put the data dir in its StateDirectory")
	}
	checkFlags(t, "leased.service", known, referenced)
}
