package deploy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/tests/internal/proc"
)

// TestKubernetesTLS runs the StatefulSet's configuration as three local processes: each gets the
// container's environment from statefulset.yaml as written ($(VAR) expanded, LEASED_NAME its pod name),
// with only the Secret mounts, the data volume and the addresses moved onto this machine, and the
// certificates README.md describes: the leased-tls Secret (a client-port certificate naming `leased` and
// `*.leased-peer`, the client CA) and the leased-peer-tls Secret (a peer CA of its own and one certificate
// per pod, CN the pod's name, serverAuth and clientAuth). The three must form a cluster whose every node
// is ready, and serve a client with a client certificate on the client port and the HTTP/JSON port.
func TestKubernetesTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs leased processes: skipped under -short (make test-short); make test runs it")
	}
	bin, err := proc.Build(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	sts := loadStatefulSet(t)
	pods := make([]string, sts.Replicas)
	for i := range pods {
		pods[i] = fmt.Sprintf("leased-%d", i)
	}
	dir := t.TempDir()
	tlsDir, peerDir := filepath.Join(dir, "tls"), filepath.Join(dir, "peer-tls")
	clientCert, clientCA := makeKubernetesCerts(t, tlsDir, peerDir, pods)
	aclDir := filepath.Join(dir, "acl")
	writeConfigMap(t, aclDir, "leased-acl")

	ports := []string{"7101", "7201", "7401", "7501"}
	addrs := map[string]string{} // "leased-0:7101" -> 127.0.0.1:N
	free := proc.FreeAddrs(t, len(pods)*len(ports))
	for i, pod := range pods {
		for j, p := range ports {
			addrs[pod+":"+p] = free[i*len(ports)+j]
		}
	}
	c := sts.Template.Spec.Containers[0]
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m.MountPath
	}
	for _, pod := range pods {
		env := podEnv(t, c, pod)
		// The pod's file system and network, moved onto this machine.
		local := strings.NewReplacer(mounts["tls"], tlsDir, mounts["peer-tls"], peerDir, mounts["acl"], aclDir,
			mounts["data"], filepath.Join(dir, pod))
		for k, v := range env {
			v = local.Replace(v)
			v = regexp.MustCompile(`(leased-\d+)\.`+sts.ServiceName+`:(\d+)`).ReplaceAllStringFunc(v, func(s string) string {
				m := regexp.MustCompile(`(leased-\d+)\.[a-z-]+:(\d+)`).FindStringSubmatch(s)
				return addrs[m[1]+":"+m[2]]
			})
			if _, port, ok := strings.Cut(v, "0.0.0.0:"); ok {
				v = addrs[pod+":"+port]
			}
			env[k] = v
		}
		startPod(t, bin, filepath.Join(dir, pod+".log"), env)
	}

	// Every node becomes ready: /readyz, the readiness probe, answers 200 once it knows a leader.
	for _, pod := range pods {
		url := "http://" + addrs[pod+":7401"] + "/readyz"
		var last string
		if err := proc.Poll(30*time.Second, func() bool {
			resp, err := http.Get(url)
			if err != nil {
				last = err.Error()
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			last = fmt.Sprintf("%s %s", resp.Status, b)
			return resp.StatusCode == http.StatusOK
		}); err != nil {
			t.Fatalf("%s is not ready: %v (last: %s); its log:\n%s", pod, err, last, readTail(filepath.Join(dir, pod+".log")))
		}
	}

	// A client with a certificate from the client CA, verifying the node's as `leased` (the Service).
	clientTLS := &tls.Config{Certificates: []tls.Certificate{clientCert}, RootCAs: clientCA, ServerName: "leased"}
	conn, err := grpc.NewClient(addrs["leased-0:7101"], grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := leasepb.NewLeasesClient(conn).Acquire(ctx, &leasepb.AcquireRequest{Resource: "k8s/a", Holder: "t", TtlMs: 30000}); err != nil {
		t.Fatalf("acquire with a client certificate: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 10 * time.Second}
	resp, err := hc.Get("https://" + addrs["leased-1:7501"] + "/v1/leases/k8s/a")
	if err != nil {
		t.Fatalf("the HTTP/JSON port: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"holder":"t"`) {
		t.Fatalf("GET /v1/leases/k8s/a on the HTTP/JSON port: %s %s", resp.Status, b)
	}
}

func loadStatefulSet(t *testing.T) statefulSetSpec {
	t.Helper()
	for _, o := range loadKubernetes(t) {
		if o.Kind == "StatefulSet" {
			return decodeSpec[statefulSetSpec](t, o)
		}
	}
	t.Fatal("no StatefulSet in deploy/kubernetes")
	return statefulSetSpec{}
}

// podEnv is the container's environment in pod: LEASED_NAME (metadata.name) is the pod's name, and
// $(VAR) expands the variables defined before, as the kubelet does.
func podEnv(t *testing.T, c container, pod string) map[string]string {
	t.Helper()
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`)
	for _, e := range c.Env {
		v := e.Value
		if e.Name == "LEASED_NAME" {
			v = pod
		}
		env[e.Name] = ref.ReplaceAllStringFunc(v, func(s string) string { return env[ref.FindStringSubmatch(s)[1]] })
	}
	if env["LEASED_NAME"] != pod {
		t.Fatalf("the StatefulSet does not set LEASED_NAME")
	}
	return env
}

// startPod starts leased with env as its only LEASED_* configuration; t's cleanup kills it.
func startPod(t *testing.T, bin, logPath string, env map[string]string) {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LEASED_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	return tail(string(b))
}

// makeKubernetesCerts writes the two Secrets' files as README.md describes them: tlsDir holds tls.crt,
// tls.key (the client port's certificate) and ca.crt (the client CA); peerDir holds ca.crt (the peer CA)
// and POD.crt, POD.key for every pod. It returns a client certificate and the client CA.
func makeKubernetesCerts(t *testing.T, tlsDir, peerDir string, pods []string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	for _, d := range []string{tlsDir, peerDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ca, caKey := newCA(t, "leased client CA")
	peerCA, peerKey := newCA(t, "leased peer CA")
	writePEM(t, filepath.Join(tlsDir, "ca.crt"), "CERTIFICATE", ca.Raw)
	writePEM(t, filepath.Join(peerDir, "ca.crt"), "CERTIFICATE", peerCA.Raw)
	serve := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	issueTo(t, tlsDir, "tls", ca, caKey, &x509.Certificate{Subject: pkix.Name{CommonName: "leased"},
		DNSNames: []string{"leased", "*.leased-peer"}, ExtKeyUsage: serve})
	for _, pod := range pods {
		issueTo(t, peerDir, pod, peerCA, peerKey, &x509.Certificate{Subject: pkix.Name{CommonName: pod},
			DNSNames:    []string{pod, pod + ".leased-peer"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	}
	clientDir := t.TempDir()
	issueTo(t, clientDir, "client", ca, caKey, &x509.Certificate{Subject: pkix.Name{CommonName: "ops"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	cert, err := tls.LoadX509KeyPair(filepath.Join(clientDir, "client.crt"), filepath.Join(clientDir, "client.key"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return cert, pool
}

func newCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// issueTo signs tmpl with the CA and writes dir/name.crt and dir/name.key.
func issueTo(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.SerialNumber = serial
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
	writePEM(t, filepath.Join(dir, name+".key"), "PRIVATE KEY", keyDER)
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeConfigMap writes the named ConfigMap's data from deploy/kubernetes as files into dir, as its
// volume would hold them.
func writeConfigMap(t *testing.T, dir, name string) {
	t.Helper()
	for _, o := range loadKubernetes(t) {
		if o.Kind != "ConfigMap" || o.Metadata.Name != name {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for file, body := range o.Data {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	t.Fatalf("no ConfigMap %s in deploy/kubernetes", name)
}
