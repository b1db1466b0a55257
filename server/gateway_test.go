package server_test

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server"
	"github.com/leased/leased/server/servertest"
)

// The HTTP/JSON API (server/internal/rpc/gateway.go, docs/http.md), exercised as curl would: plain net/http requests
// with JSON bodies against the HTTP port of a real 3-node cluster.

// httpAPI sends requests to one node's HTTP port.
type httpAPI struct {
	t      *testing.T
	base   string
	client *http.Client
}

// newHTTPAPI talks to addr over plain HTTP, or HTTPS with tlsCfg.
func newHTTPAPI(t *testing.T, addr string, tlsCfg *tls.Config) *httpAPI {
	tr := &http.Transport{TLSClientConfig: tlsCfg}
	t.Cleanup(tr.CloseIdleConnections)
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	return &httpAPI{t: t, base: scheme + "://" + addr, client: &http.Client{Transport: tr, Timeout: 20 * time.Second}}
}

// reply is a decoded JSON answer.
type reply struct {
	status int
	body   map[string]any
	raw    string
}

// send makes one request; body, if not empty, is sent as JSON.
func (h *httpAPI) send(method, path, body string) (reply, error) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.base+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	r := reply{status: resp.StatusCode, raw: string(raw)}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		h.t.Fatalf("%s %s: Content-Type %q, want application/json (body %s)", method, path, ct, raw)
	}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		h.t.Fatalf("%s %s: answer is not a JSON object: %v: %s", method, path, err, raw)
	}
	return r, nil
}

// do is send that fails the test on a transport error and on a status other than want.
func (h *httpAPI) do(method, path, body string, want int) map[string]any {
	h.t.Helper()
	r, err := h.send(method, path, body)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	if r.status != want {
		h.t.Fatalf("%s %s %s: status %d, want %d: %s", method, path, body, r.status, want, r.raw)
	}
	return r.body
}

// field walks a decoded JSON object along keys.
func field(t *testing.T, v any, keys ...string) any {
	t.Helper()
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("looking up %q in %v: not an object", k, v)
		}
		if v, ok = m[k]; !ok {
			t.Fatalf("no field %q in %v", k, m)
		}
	}
	return v
}

// detail returns the error body's detail of the given type (its @type ends with typ).
func detail(t *testing.T, body map[string]any, typ string) map[string]any {
	t.Helper()
	details, _ := body["details"].([]any)
	for _, d := range details {
		m, _ := d.(map[string]any)
		if s, _ := m["@type"].(string); strings.HasSuffix(s, "/"+typ) {
			return m
		}
	}
	t.Fatalf("no %s detail in %v", typ, body)
	return nil
}

// TestHTTPLeaseLifecycle acquires, reads, lists, renews and releases a lease over HTTP on a follower (the
// writes are forwarded to the leader), with protobuf's JSON field names both ways.
func TestHTTPLeaseLifecycle(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	api := newHTTPAPI(t, c.HTTPAddrs()[c.Follower()], nil)
	res := "jobs/nightly:build@eu=1+x" // every punctuation a name may carry, "/" and ":" included

	got := api.do("POST", "/v1/leases/acquire",
		fmt.Sprintf(`{"resource": %q, "holder": "worker-1", "ttlMs": 10000, "requestId": "req-1", "value": "aGk="}`, res), http.StatusOK)
	lease := field(t, got, "lease").(map[string]any)
	token := field(t, lease, "token").(string) // uint64 is a JSON string in protobuf's mapping
	if field(t, lease, "resource") != res || field(t, lease, "holder") != "worker-1" ||
		field(t, lease, "ttlMs") != "10000" || field(t, lease, "requestId") != "req-1" || field(t, lease, "value") != "aGk=" ||
		field(t, got, "replayed") != false || field(t, got, "header", "leaderId") == "0" {
		t.Fatalf("acquire answered %v", got)
	}
	// The same request id again (proto field names are accepted too): the same grant, replayed.
	again := api.do("POST", "/v1/leases/acquire",
		fmt.Sprintf(`{"resource": %q, "holder": "worker-1", "ttl_ms": "10000", "request_id": "req-1", "value": "aGk="}`, res), http.StatusOK)
	if field(t, again, "lease", "token") != token || field(t, again, "replayed") != true {
		t.Fatalf("retried acquire answered %v, want token %s replayed", again, token)
	}

	got = api.do("GET", "/v1/leases/"+res, "", http.StatusOK)
	if field(t, got, "lease", "token") != token || field(t, got, "lease", "holder") != "worker-1" {
		t.Fatalf("get answered %v", got)
	}
	got = api.do("GET", "/v1/leases/"+res+"?serializable=true", "", http.StatusOK)
	if field(t, got, "lease", "token") != token {
		t.Fatalf("serializable get answered %v", got)
	}

	api.do("POST", "/v1/leases/acquire", `{"resource": "other/x", "holder": "worker-2", "ttlMs": 10000}`, http.StatusOK)
	got = api.do("GET", "/v1/leases?prefix=jobs/", "", http.StatusOK)
	leases := field(t, got, "leases").([]any)
	if len(leases) != 1 || field(t, leases[0], "resource") != res || field(t, got, "nextPageToken") != "" {
		t.Fatalf("list jobs/ answered %v", got)
	}
	got = api.do("GET", "/v1/leases?limit=1", "", http.StatusOK)
	if n := len(field(t, got, "leases").([]any)); n != 1 || field(t, got, "nextPageToken") == "" {
		t.Fatalf("list with limit 1 answered %v, want one lease and a next page", got)
	}

	got = api.do("POST", "/v1/leases/validate", fmt.Sprintf(`{"resource": %q, "token": %s}`, res, token), http.StatusOK)
	if field(t, got, "current") != true || field(t, got, "currentToken") != token {
		t.Fatalf("validate answered %v", got)
	}
	got = api.do("POST", "/v1/leases/renew", fmt.Sprintf(`{"resource": %q, "token": %q}`, res, token), http.StatusOK)
	if field(t, got, "ttlMs") != "10000" {
		t.Fatalf("renew answered %v", got)
	}
	got = api.do("POST", "/v1/leases/release", fmt.Sprintf(`{"resource": %q, "token": %s}`, res, token), http.StatusOK)
	if field(t, got, "alreadyReleased") != false || field(t, got, "releasedIndex") == "0" {
		t.Fatalf("release answered %v", got)
	}
	got = api.do("POST", "/v1/leases/release", fmt.Sprintf(`{"resource": %q, "token": %s}`, res, token), http.StatusOK)
	if field(t, got, "alreadyReleased") != true {
		t.Fatalf("a retried release answered %v, want alreadyReleased", got)
	}
	api.do("GET", "/v1/leases/"+res, "", http.StatusNotFound)
}

// TestHTTPErrorStatuses: each gRPC code leased answers maps to its HTTP status, with the status as JSON
// (code, message, details) in the body.
func TestHTTPErrorStatuses(t *testing.T) {
	c := servertest.Start(t, 3, func(cfg *server.Config) {
		cfg.Limits.MaxLeasesPerHolder = 2
		cfg.Limits.MaxRequestBytes = 64 << 10
	})
	api := newHTTPAPI(t, c.HTTPAddrs()[c.WaitLeader()], nil)
	api.do("POST", "/v1/leases/acquire", `{"resource": "db/primary", "holder": "a", "ttlMs": 10000}`, http.StatusOK)

	held := api.do("POST", "/v1/leases/acquire", `{"resource": "db/primary", "holder": "b", "ttlMs": 10000}`, http.StatusConflict)
	if field(t, held, "code") != float64(9) || !strings.Contains(field(t, held, "message").(string), "held by") {
		t.Errorf("held: %v, want code 9 (FAILED_PRECONDITION) and a message naming the holder", held)
	}
	if d := detail(t, held, "leased.v1.LeaseHeld"); d["holder"] != "a" || d["resource"] != "db/primary" {
		t.Errorf("held detail %v", d)
	}

	missing := api.do("GET", "/v1/leases/db/replica", "", http.StatusNotFound)
	if field(t, missing, "code") != float64(5) {
		t.Errorf("not found: %v", missing)
	}
	ended := api.do("POST", "/v1/leases/release", `{"resource": "db/replica", "token": 12345}`, http.StatusNotFound)
	detail(t, ended, "leased.v1.LeaseEnded")

	badTTL := api.do("POST", "/v1/leases/acquire", `{"resource": "x", "holder": "a", "ttlMs": 5}`, http.StatusBadRequest)
	if d := detail(t, badTTL, "google.rpc.BadRequest"); !strings.Contains(fmt.Sprint(d), "ttl_ms") {
		t.Errorf("bad TTL detail %v does not name ttl_ms", d)
	}
	api.do("POST", "/v1/leases/acquire", `{"resource": "bad//name", "holder": "a", "ttlMs": 10000}`, http.StatusBadRequest)
	unknown := api.do("POST", "/v1/leases/acquire", `{"resource": "x", "holder": "a", "ttl": 10000}`, http.StatusBadRequest)
	if !strings.Contains(field(t, unknown, "message").(string), "ttl") {
		t.Errorf("an unknown field: %v, want a message naming it", unknown)
	}
	api.do("POST", "/v1/leases/acquire", `{"resource": `, http.StatusBadRequest)
	api.do("GET", "/v1/leases?limit=many", "", http.StatusBadRequest)

	api.do("POST", "/v1/leases/acquire", `{"resource": "q/1", "holder": "a", "ttlMs": 10000}`, http.StatusOK)
	quota := api.do("POST", "/v1/leases/acquire", `{"resource": "q/2", "holder": "a", "ttlMs": 10000}`, http.StatusTooManyRequests)
	detail(t, quota, "google.rpc.QuotaFailure")

	big := fmt.Sprintf(`{"resource": "x", "holder": "a", "ttlMs": 10000, "value": %q}`, strings.Repeat("A", 100<<10))
	api.do("POST", "/v1/leases/acquire", big, http.StatusRequestEntityTooLarge)

	api.do("GET", "/v2/nothing", "", http.StatusNotFound)
	api.do("DELETE", "/v1/leases/acquire", "", http.StatusMethodNotAllowed)

	// With two of three nodes down the last one has no quorum: writes answer 503 with the leader hint
	// once it notices (at once, or after its proposal or forward fails).
	last := c.Follower()
	for i := range c.Size() {
		if i != last {
			c.Stop(i)
		}
	}
	api = newHTTPAPI(t, c.HTTPAddrs()[last], nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := api.send("POST", "/v1/leases/acquire", `{"resource": "y", "holder": "a", "ttlMs": 10000}`)
		if err != nil {
			t.Fatal(err)
		}
		if r.status == http.StatusServiceUnavailable {
			if field(t, r.body, "code") != float64(14) {
				t.Errorf("unavailable: %v", r.body)
			}
			detail(t, r.body, "leased.v1.LeaderHint")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no 503 within 30s without quorum; last answer %d %s", r.status, r.raw)
		}
		time.Sleep(50 * time.Millisecond) // poll: the node has not yet noticed it lost its peers
	}
}

// TestHTTPIdentitiesAndACLs: on a cluster that requires client certificates, the HTTP port requires them
// too, a request's identity is its certificate's, and the ACL and lease ownership apply as on gRPC.
func TestHTTPIdentitiesAndACLs(t *testing.T) {
	ca := servertest.NewCA(t)
	c := servertest.StartWithACL(t, 3, ca, "ops", aclTestRules, nil)
	addr := c.HTTPAddrs()[c.Follower()]
	alice := newHTTPAPI(t, addr, ca.ClientTLS("alice"))
	reader := newHTTPAPI(t, addr, ca.ClientTLS("reader"))

	got := alice.do("POST", "/v1/leases/acquire", `{"resource": "jobs/a", "holder": "h", "ttlMs": 10000, "requestId": "r1"}`, http.StatusOK)
	token := field(t, got, "lease", "token").(string)
	if field(t, got, "lease", "identity") != "alice" {
		t.Fatalf("the lease's identity is %v, want alice (her certificate's CN)", field(t, got, "lease", "identity"))
	}

	denied := alice.do("POST", "/v1/leases/acquire", `{"resource": "db/a", "holder": "h", "ttlMs": 10000}`, http.StatusForbidden)
	if d := detail(t, denied, "leased.v1.AccessDenied"); d["identity"] != "alice" || d["permission"] != "PERMISSION_LEASE" || d["resource"] != "db/a" {
		t.Errorf("denied detail %v", d)
	}
	reader.do("POST", "/v1/leases/acquire", `{"resource": "jobs/b", "holder": "h", "ttlMs": 10000}`, http.StatusForbidden)
	owned := reader.do("POST", "/v1/leases/release", fmt.Sprintf(`{"resource": "jobs/a", "token": %s}`, token), http.StatusForbidden)
	if d := detail(t, owned, "leased.v1.AccessDenied"); d["owner"] != "alice" {
		t.Errorf("releasing alice's lease as reader: detail %v, want owner alice", d)
	}
	got = reader.do("GET", "/v1/leases/jobs/a", "", http.StatusOK)
	if field(t, got, "lease", "requestId") != "" {
		t.Errorf("reader sees alice's request id: %v", got)
	}
	if got = alice.do("GET", "/v1/leases/jobs/a", "", http.StatusOK); field(t, got, "lease", "requestId") != "r1" {
		t.Errorf("alice does not see her own request id: %v", got)
	}
	alice.do("POST", "/v1/leases/renew", fmt.Sprintf(`{"resource": "jobs/a", "token": %s}`, token), http.StatusOK)
	alice.do("POST", "/v1/leases/release", fmt.Sprintf(`{"resource": "jobs/a", "token": %s}`, token), http.StatusOK)

	// Without a client certificate the handshake fails; without TLS the server refuses plaintext.
	noCert := ca.ClientTLS("alice").Clone()
	noCert.Certificates, noCert.GetClientCertificate = nil, nil
	if r, err := newHTTPAPI(t, addr, noCert).send("GET", "/v1/leases/jobs/a", ""); err == nil {
		t.Errorf("a request without a client certificate was answered: %d %s", r.status, r.raw)
	}
	resp, err := http.Get("http://" + addr + "/v1/leases/jobs/a")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plaintext to the TLS port answered %d", resp.StatusCode)
		}
	}
}

// TestHTTPAcquireWaitsUntilFree: wait=true over HTTP queues until the holder releases; a waiter whose
// client goes away leaves the queue.
func TestHTTPAcquireWaitsUntilFree(t *testing.T) {
	registry := prometheus.NewRegistry()
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Registerer = registry })
	api := newHTTPAPI(t, c.HTTPAddrs()[0], nil)
	got := api.do("POST", "/v1/leases/acquire", `{"resource": "w", "holder": "a", "ttlMs": 10000}`, http.StatusOK)
	token := field(t, got, "lease", "token").(string)
	waiters := func(n float64) func() bool {
		return func() bool { return gather(t, registry).value("leased_waiters") == n }
	}

	// A waiter that gives up (its client's timeout) leaves the queue.
	quitter := newHTTPAPI(t, c.HTTPAddrs()[0], nil)
	quitter.client.Timeout = 500 * time.Millisecond
	if r, err := quitter.send("POST", "/v1/leases/acquire", `{"resource": "w", "holder": "q", "ttlMs": 10000, "wait": true}`); err == nil {
		t.Fatalf("a waiting acquire on a held resource answered %d %s", r.status, r.raw)
	}
	eventually(t, 10*time.Second, "the abandoned waiter to leave the queue", waiters(0))

	// A waiter with a deadline (grpc-gateway's Grpc-Timeout header) is answered 504 when it passes.
	req, err := http.NewRequest("POST", api.base+"/v1/leases/acquire",
		strings.NewReader(`{"resource": "w", "holder": "d", "ttlMs": 10000, "wait": true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Grpc-Timeout", "300m")
	resp, err := api.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("a waiting acquire past its Grpc-Timeout: %d %s, want 504", resp.StatusCode, raw)
	}
	eventually(t, 10*time.Second, "the timed-out waiter to leave the queue", waiters(0))

	// A wait with an end (waitMs) is answered when it ends: 409, naming the holder.
	ended := api.do("POST", "/v1/leases/acquire", `{"resource": "w", "holder": "e", "ttlMs": 10000, "wait": true, "waitMs": 200}`, http.StatusConflict)
	if d := detail(t, ended, "leased.v1.LeaseHeld"); d["holder"] != "a" {
		t.Fatalf("a wait that ended: %v, want the holder a named", ended)
	}
	eventually(t, 10*time.Second, "the ended waiter to leave the queue", waiters(0))

	type result struct {
		r   reply
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := api.send("POST", "/v1/leases/acquire", `{"resource": "w", "holder": "b", "ttlMs": 10000, "wait": true}`)
		done <- result{r, err}
	}()
	eventually(t, 10*time.Second, "the HTTP acquire to queue", waiters(1))
	api.do("POST", "/v1/leases/release", fmt.Sprintf(`{"resource": "w", "token": %s}`, token), http.StatusOK)
	select {
	case res := <-done:
		if res.err != nil || res.r.status != http.StatusOK || field(t, res.r.body, "lease", "holder") != "b" {
			t.Fatalf("waiting acquire: %v %d %s", res.err, res.r.status, res.r.raw)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting acquire was not granted within 20s of the release")
	}
}

// TestHTTPBodyIsBounded: a chunked body (no Content-Length) larger than the limit is refused too.
func TestHTTPBodyIsBounded(t *testing.T) {
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Limits.MaxRequestBytes = 1 << 10 })
	api := newHTTPAPI(t, c.HTTPAddrs()[0], nil)
	body := fmt.Sprintf(`{"resource": "x", "holder": "a", "ttlMs": 10000, "value": %q}`, strings.Repeat("A", 4<<10))
	req, err := http.NewRequest("POST", api.base+"/v1/leases/acquire", io.MultiReader(bytes.NewReader([]byte(body))))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := api.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "too large") {
		t.Fatalf("a 4 KiB chunked body over a 1 KiB limit: %d %s", resp.StatusCode, raw)
	}
}

// TestHTTPShutdownEndsWaitingRequests: closing a node with an HTTP acquire waiting in its queue returns
// (the gateway cancels the request after its grace) and leaves no handler running (goleak, TestMain).
func TestHTTPShutdownEndsWaitingRequests(t *testing.T) {
	registry := prometheus.NewRegistry()
	c := servertest.Start(t, 1, func(cfg *server.Config) { cfg.Registerer = registry })
	api := newHTTPAPI(t, c.HTTPAddrs()[0], nil)
	api.do("POST", "/v1/leases/acquire", `{"resource": "s", "holder": "a", "ttlMs": 10000}`, http.StatusOK)
	done := make(chan error, 1)
	go func() {
		r, err := api.send("POST", "/v1/leases/acquire", `{"resource": "s", "holder": "b", "ttlMs": 10000, "wait": true}`)
		if err == nil && r.status == http.StatusOK {
			err = fmt.Errorf("granted during shutdown: %s", r.raw)
		}
		done <- err
	}()
	eventually(t, 10*time.Second, "the HTTP acquire to queue", func() bool { return gather(t, registry).value("leased_waiters") == 1 })
	c.Stop(0)
	select {
	case err := <-done: // a transport error or a non-200 answer: the request ended without a grant
		if err != nil && strings.HasPrefix(err.Error(), "granted") {
			t.Error(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting HTTP request did not end within 20s of the node's Close")
	}
}

// TestOpenAPIFileHasTheRoutes: the OpenAPI file make proto generates describes the routes docs/http.md
// promises, with their methods.
func TestOpenAPIFileHasTheRoutes(t *testing.T) {
	raw, err := os.ReadFile("../api/openapi/leased.swagger.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"post /v1/leases/acquire":   "Leases_Acquire",
		"post /v1/leases/renew":     "Leases_Renew",
		"post /v1/leases/release":   "Leases_Release",
		"post /v1/leases/validate":  "Leases_ValidateToken",
		"post /v1/leases/proclaim":  "Leases_Proclaim",
		"get /v1/leases/{resource}": "Leases_Get",
		"get /v1/leases":            "Leases_List",
	}
	got := map[string]string{}
	for path, methods := range doc.Paths {
		for method, op := range methods {
			got[method+" "+path] = op.OperationID
		}
	}
	if !maps.Equal(got, want) {
		t.Errorf("OpenAPI routes %v, want %v", got, want)
	}
}

// TestHTTPEdges: a value that is not padded base64 is a 400 naming the field and stores nothing; a known
// path with another method is a 405 with Allow (GET /v1/leases/acquire is not a Get of "acquire"); ids
// are spelled as on gRPC's side by leasectl and the logs (16 hex digits); /healthz answers on the port.
func TestHTTPEdges(t *testing.T) {
	c := servertest.Start(t, 3, nil)
	leader := c.WaitLeader()
	api := newHTTPAPI(t, c.HTTPAddrs()[leader], nil)

	for _, bad := range []string{"hi", "aGk", "a", "aGk=aGk=x", "aG!="} {
		body := fmt.Sprintf(`{"resource": "b64/x", "holder": "a", "ttlMs": 10000, "value": %q}`, bad)
		got := api.do("POST", "/v1/leases/acquire", body, http.StatusBadRequest)
		if msg := field(t, got, "message").(string); !strings.Contains(msg, `"value"`) || !strings.Contains(msg, "base64") {
			t.Errorf("value %q: message %q does not name the field and base64", bad, msg)
		}
	}
	api.do("GET", "/v1/leases/b64/x", "", http.StatusNotFound) // nothing was stored
	got := api.do("POST", "/v1/leases/acquire", `{"resource": "b64/x", "holder": "a", "ttlMs": 10000, "value": "-_8="}`, http.StatusOK)
	if field(t, got, "lease", "value") != "+/8=" { // URL-safe accepted; answers use the standard alphabet
		t.Errorf("URL-safe value answered %v", got)
	}
	token := field(t, got, "lease", "token").(string)
	api.do("POST", "/v1/leases/proclaim", fmt.Sprintf(`{"resource": "b64/x", "token": %s, "value": "hi"}`, token), http.StatusBadRequest)

	// Ids as FormatID spells them, equal to the gRPC answer's.
	g, err := c.Leases(leader).Get(t.Context(), &leasepb.GetRequest{Resource: "b64/x"})
	if err != nil {
		t.Fatal(err)
	}
	h := g.GetHeader()
	for name, want := range map[string]uint64{"clusterId": h.GetClusterId(), "memberId": h.GetMemberId(), "leaderId": h.GetLeaderId()} {
		if v := field(t, got, "header", name); v != leasepb.FormatID(want) {
			t.Errorf("header %s = %v, want %s", name, v, leasepb.FormatID(want))
		}
	}

	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/v1/leases/acquire", "POST"},
		{"GET", "/v1/leases/proclaim", "POST"},
		{"PUT", "/v1/leases/renew", "POST"},
		{"POST", "/v1/leases", "GET"},
		{"DELETE", "/v1/leases/b64/x", "GET"},
	} {
		resp := rawRequest(t, api, tc.method, tc.path)
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", tc.method, tc.path, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
		}
	}

	resp := rawRequest(t, api, "GET", "/healthz")
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz: %d", resp.StatusCode)
	}
}

// rawRequest sends a bodiless request and returns the answer with its body read and closed.
func rawRequest(t *testing.T, api *httpAPI, method, path string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, api.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := api.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}
