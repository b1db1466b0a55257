package auth

import (
	"context"
	"crypto/x509"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Client identity (decision 10). With Config.ClientCertAuth a request's identity is read from the client
// certificate its TLS connection verified, by one rule: the leaf certificate's subject Common Name, or, when
// the CN is empty, its first URI SAN (as url.URL.String spells it, e.g. "spiffe://example.org/billing").
// DNS and e-mail SANs are never used. Without ClientCertAuth there is no identity and ACLs are off.
//
// Identity is the one place an identity is read, for both client ports: a gRPC connection's peer carries
// its TLS state, and the HTTP/JSON API (server/internal/rpc/gateway.go) puts each request's TLS connection state into the
// context as the same kind of peer, so an HTTP request has exactly the identity its certificate names.
//
// Only the node a client reached reads the certificate; a write it forwards carries the identity in
// ForwardRequest.identity, which the leader trusts because peers are trusted members.

// MaxIdentityBytes bounds an identity, as it bounds an ACL rule's (api/acl).
const maxIdentityBytes = 256

// Identity returns the identity of the client that sent the request ctx belongs to: "" without
// ClientCertAuth, else its certificate's identity or an Unauthenticated error.
func (a *Authorizer) Identity(ctx context.Context) (string, error) {
	if !a.identities {
		return "", nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", Unauthenticated("the request came without a connection to read a certificate from")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", Unauthenticated("the connection is not TLS; this node requires client certificates (--client-cert-auth)")
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "", Unauthenticated("the connection carries no verified client certificate; this node requires one (--client-cert-auth)")
	}
	id := certIdentity(chains[0][0])
	switch {
	case id == "":
		return "", Unauthenticated("the client certificate names no identity (empty subject CN and no URI SAN)")
	case len(id) > maxIdentityBytes || !printableASCII(id):
		return "", Unauthenticated("the client certificate's identity is not 1..256 printable ASCII bytes without spaces")
	}
	return id, nil
}

// certIdentity is the identity a certificate names: its subject CN, else its first URI SAN, else "".
func certIdentity(cert *x509.Certificate) string {
	if cert.Subject.CommonName != "" {
		return cert.Subject.CommonName
	}
	if len(cert.URIs) > 0 {
		return cert.URIs[0].String()
	}
	return ""
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
