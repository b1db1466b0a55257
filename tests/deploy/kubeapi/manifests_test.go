// Package kubeapi decodes deploy/kubernetes against the Kubernetes API types, strictly: a misspelt or
// misplaced field, or a value of the wrong type, fails here rather than at `kubectl apply`. It is a module
// of its own so that the server's module does not gain the Kubernetes API's dependencies; scripts/test.sh
// runs it.
package kubeapi

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

const dir = "../../../deploy/kubernetes"

type manifests struct {
	sts        []appsv1.StatefulSet
	services   []corev1.Service
	pdbs       []policyv1.PodDisruptionBudget
	configMaps []corev1.ConfigMap
}

// load decodes every document of every manifest strictly into its kind's API type.
func load(t *testing.T) manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	var m manifests
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---$`).Split(string(b), -1) {
			var meta struct{ Kind, APIVersion string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s document %d: %v", f, i, err)
			}
			var err error
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 StatefulSet":
				m.sts = append(m.sts, appsv1.StatefulSet{})
				err = yaml.UnmarshalStrict([]byte(doc), &m.sts[len(m.sts)-1])
			case "v1 Service":
				m.services = append(m.services, corev1.Service{})
				err = yaml.UnmarshalStrict([]byte(doc), &m.services[len(m.services)-1])
			case "policy/v1 PodDisruptionBudget":
				m.pdbs = append(m.pdbs, policyv1.PodDisruptionBudget{})
				err = yaml.UnmarshalStrict([]byte(doc), &m.pdbs[len(m.pdbs)-1])
			case "v1 ConfigMap":
				m.configMaps = append(m.configMaps, corev1.ConfigMap{})
				err = yaml.UnmarshalStrict([]byte(doc), &m.configMaps[len(m.configMaps)-1])
			default:
				t.Fatalf("%s document %d: unexpected %s %s", f, i, meta.APIVersion, meta.Kind)
			}
			if err != nil {
				t.Fatalf("%s document %d (%s): %v", f, i, meta.Kind, err)
			}
		}
	}
	if len(m.sts) != 1 || len(m.services) != 2 || len(m.pdbs) != 1 || len(m.configMaps) != 1 {
		t.Fatalf("want one StatefulSet, two Services, one PodDisruptionBudget and one ConfigMap; got %d, %d, %d, %d",
			len(m.sts), len(m.services), len(m.pdbs), len(m.configMaps))
	}
	return m
}

func TestManifestsDecodeStrictly(t *testing.T) {
	m := load(t)
	sts := m.sts[0]
	pod := sts.Spec.Template
	podLabels := labels.Set(pod.Labels)
	if sel := sts.Spec.Selector; sel == nil || !labels.SelectorFromSet(sel.MatchLabels).Matches(podLabels) {
		t.Errorf("the StatefulSet's selector does not select its pods")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("want one container, got %d", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, want := range map[string]int32{"client": 7101, "peer": 7201, "admin": 7401, "http": 7501} {
		if ports[name] != want {
			t.Errorf("container port %s = %d, want %d", name, ports[name], want)
		}
	}

	// Probes: readiness /readyz and liveness /healthz on the admin port.
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.ReadinessProbe, "/readyz"}, {c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "admin" {
			t.Errorf("probe %+v, want GET %s on the admin port", p.probe, p.path)
		}
	}

	// The pod's name is the node's, and each pod's peer certificate is its own: the file is named after it.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if n := env["LEASED_NAME"]; n.ValueFrom == nil || n.ValueFrom.FieldRef == nil || n.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("LEASED_NAME is not the pod's name (metadata.name): %+v", n)
	}
	for _, name := range []string{"LEASED_PEER_CERT_FILE", "LEASED_PEER_KEY_FILE"} {
		if !strings.Contains(env[name].Value, "$(LEASED_NAME)") {
			t.Errorf("%s = %q: not the pod's own (a peer certificate must name exactly one member)", name, env[name].Value)
		}
	}
	if env["LEASED_HTTP_ADDR"].Value != "0.0.0.0:7501" {
		t.Errorf("LEASED_HTTP_ADDR = %q, want 0.0.0.0:7501", env["LEASED_HTTP_ADDR"].Value)
	}

	// Every mount names a volume (or the claim template), and every volume's source exists here or is a
	// Secret README.md tells how to create.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		_, ok := volumes[vm.Name]
		if !ok && !slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == vm.Name }) {
			t.Errorf("volume mount %s names no volume", vm.Name)
		}
	}
	for _, v := range volumes {
		switch {
		case v.Secret != nil:
			if !slices.Contains([]string{"leased-tls", "leased-peer-tls"}, v.Secret.SecretName) {
				t.Errorf("volume %s: Secret %s is not one README.md describes", v.Name, v.Secret.SecretName)
			}
		case v.ConfigMap != nil:
			if m.configMaps[0].Name != v.ConfigMap.Name {
				t.Errorf("volume %s: ConfigMap %s is not in the manifests", v.Name, v.ConfigMap.Name)
			}
		default:
			t.Errorf("volume %s: unexpected source", v.Name)
		}
	}
	if acl := env["LEASED_INITIAL_ACL_FILE"].Value; filepath.Base(acl) == "" || m.configMaps[0].Data[filepath.Base(acl)] == "" {
		t.Errorf("LEASED_INITIAL_ACL_FILE = %q names no key of ConfigMap %s", acl, m.configMaps[0].Name)
	}

	// Services select the pods and reach named container ports; the client Service serves HTTP too.
	for _, s := range m.services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s does not select the pods", s.Name)
		}
		var names []string
		for _, p := range s.Spec.Ports {
			names = append(names, p.Name)
			if _, ok := ports[p.TargetPort.String()]; !ok {
				t.Errorf("Service %s port %s targets %s, which the container does not name", s.Name, p.Name, p.TargetPort.String())
			}
		}
		if !slices.Contains(names, "http") {
			t.Errorf("Service %s does not serve the HTTP/JSON port", s.Name)
		}
	}

	// At most one pod down at a time for voluntary disruptions.
	pdb := m.pdbs[0].Spec
	if pdb.MaxUnavailable == nil || pdb.MaxUnavailable.IntValue() != 1 || pdb.Selector == nil ||
		!labels.SelectorFromSet(pdb.Selector.MatchLabels).Matches(podLabels) {
		t.Errorf("PodDisruptionBudget: maxUnavailable %v, selector %v; want 1, the pods", pdb.MaxUnavailable, pdb.Selector)
	}
}

// TestStrictDecodingRefusesUnknownFields keeps the check honest: a misspelt field fails to decode.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(dir, "pdb.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(b, []byte("maxUnavailable"), []byte("maxUnavaliable"), 1)
	var pdb policyv1.PodDisruptionBudget
	if err := yaml.UnmarshalStrict(bad, &pdb); err == nil {
		t.Fatal("a misspelt field decoded without error")
	}
}
