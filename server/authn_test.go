package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/internal/auth"
	"github.com/leased/leased/server/internal/rpc"
)

func tlsPeer(verified ...*x509.Certificate) context.Context {
	state := tls.ConnectionState{PeerCertificates: verified}
	if len(verified) > 0 {
		state.VerifiedChains = [][]*x509.Certificate{verified}
	}
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}, AuthInfo: credentials.TLSInfo{State: state}})
}

func TestIdentityIsTheVerifiedCertificatesCNOrFirstURISAN(t *testing.T) {
	a := auth.New(true, nil, nil)
	spiffe, _ := url.Parse("spiffe://example.org/billing")
	other, _ := url.Parse("spiffe://example.org/other")
	for _, tc := range []struct {
		name string
		ctx  context.Context
		want string // "" means Unauthenticated
	}{
		{"CN", tlsPeer(&x509.Certificate{Subject: pkix.Name{CommonName: "alice"}, URIs: []*url.URL{spiffe}}), "alice"},
		{"first URI SAN when the CN is empty", tlsPeer(&x509.Certificate{URIs: []*url.URL{spiffe, other}, DNSNames: []string{"dns.example"}}), "spiffe://example.org/billing"},
		{"DNS SANs are not identities", tlsPeer(&x509.Certificate{DNSNames: []string{"dns.example"}}), ""},
		{"CN with a space", tlsPeer(&x509.Certificate{Subject: pkix.Name{CommonName: "a b"}}), ""},
		{"CN too long", tlsPeer(&x509.Certificate{Subject: pkix.Name{CommonName: strings.Repeat("a", 257)}}), ""},
		{"no verified chain", peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}, AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{
			PeerCertificates: []*x509.Certificate{{Subject: pkix.Name{CommonName: "unverified"}}}}}}), ""},
		{"not TLS", peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{}}), ""},
		{"no peer", context.Background(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := a.Identity(tc.ctx)
			if tc.want != "" {
				if err != nil || id != tc.want {
					t.Fatalf("identity = %q, %v; want %q", id, err, tc.want)
				}
				return
			}
			if !errors.Is(err, ErrUnauthenticated) {
				t.Fatalf("identity = %q, %v; want ErrUnauthenticated", id, err)
			}
			st := status.Convert(rpc.ToStatus(err, rpc.Hint{}))
			if st.Code() != codes.Unauthenticated || len(st.Details()) != 1 {
				t.Fatalf("status = %v %v, want Unauthenticated with AccessDenied", st.Code(), st.Details())
			}
			if _, ok := st.Details()[0].(*leasepb.AccessDenied); !ok {
				t.Fatalf("detail = %T", st.Details()[0])
			}
		})
	}
	// Without ClientCertAuth there is no identity, whatever the connection.
	off := auth.New(false, nil, nil)
	if id, err := off.Identity(tlsPeer(&x509.Certificate{Subject: pkix.Name{CommonName: "alice"}})); id != "" || err != nil {
		t.Fatalf("without client-cert-auth: %q, %v", id, err)
	}
}
