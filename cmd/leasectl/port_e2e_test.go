package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leased/leased/server/servertest"
	"github.com/leased/leased/server/servertest/testcerts"
)

// leasectl pointed at a port that is not a client port, or with TLS on one side only, says which port or
// flag to use, within the attempt. Before: 5 s, then "connection failed (transient_failure)".
func TestWrongPortOrTLSIsNamedAtOnce(t *testing.T) {
	plain := servertest.Start(t, 1, nil)
	admin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") }))
	t.Cleanup(admin.Close)
	ca := testcerts.NewCA(t, "leased-ca")
	secure := servertest.StartTLS(t, 1, ca, nil)
	caFile := ca.WriteCA(t, t.TempDir(), "ca.crt")

	for _, tc := range []struct {
		name, addr string
		tls        bool
		code       int
		msg        string
	}{
		{"HTTPPort", plain.HTTPAddrs()[0], false, exitUnavailable, "HTTP/JSON API or admin port"},
		{"AdminPort", strings.TrimPrefix(admin.URL, "http://"), false, exitUnavailable, "HTTP/JSON API or admin port"},
		{"PlaintextToTLSPort", secure.Endpoints()[0], false, exitUnavailable, "connect with TLS (leasectl --cacert"},
		{"TLSToPlaintextPort", plain.Endpoints()[0], true, exitAuth, "leave out --cacert"},
		{"TLSToPlaintextHTTPPort", plain.HTTPAddrs()[0], true, exitAuth, "HTTP/JSON API or admin port"},
		{"TLSToHTTPSPort", secure.HTTPAddrs()[0], true, exitAuth, "HTTP/JSON API or admin port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			if tc.tls {
				args = []string{"--cacert", caFile}
			}
			r := want(t, ctl(t, []string{tc.addr}, append(args, "get", "x")...), tc.code)
			if !strings.Contains(r.stderr, tc.addr) || !strings.Contains(r.stderr, tc.msg) || strings.Contains(r.stderr, "transient_failure") {
				t.Errorf("want %s named with %q, got %v", tc.addr, tc.msg, r)
			}
			t.Logf("%s", r.stderr)
			if r.elapsed > 4*time.Second { // --timeout is 5s
				t.Errorf("took %v: it waited out --timeout", r.elapsed)
			}
			st := ctl(t, []string{tc.addr}, append(args, "status")...)
			if !strings.Contains(st.stdout+st.stderr, tc.msg) {
				t.Errorf("status does not name the cause %q: %v", tc.msg, st)
			}
		})
	}
}
