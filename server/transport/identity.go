package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/leased/leased/api/leasepb"
	"github.com/leased/leased/server/tlsfiles"
)

// Peer identity with Config.TLS: a node's certificate names its member, by its CN or one of its DNS
// SANs (other SANs, such as localhost, name no member and are ignored). It is a member credential only if
// it is meant for peers: it lists both the serverAuth and the clientAuth extended key usages (a client
// certificate, clientAuth alone, never speaks for a member even if its CN or a SAN is a member name), and
// passes Config.AllowedCNs and Config.AllowedHostnames. The handshake is refused, both ways, when the
// certificate is not a member credential, names no member or more than one; a dial also checks that the
// member is the peer it meant to reach. Inbound links and calls then carry the member's raft id, against which
// every batch's sender is checked (Transport.deliver).

// RejectSenderMismatch is the OnRejected reason for a batch whose sender is not its certificate's member.
const RejectSenderMismatch = "sender_mismatch"

// memberOf is the raft id of the member cert names, if cert is a member credential (peerCredential).
func (t *Transport) memberOf(cert *x509.Certificate) (uint64, error) {
	if err := t.peerCredential(cert); err != nil {
		return 0, err
	}
	names := append([]string{cert.Subject.CommonName}, cert.DNSNames...)
	var ids []uint64
	var named []string
	for _, name := range names {
		if name == "" {
			continue
		}
		if id, ok := t.cfg.MemberID(name); ok && !slices.Contains(ids, id) {
			ids, named = append(ids, id), append(named, name)
		}
	}
	switch len(ids) {
	case 1:
		return ids[0], nil
	case 0:
		return 0, fmt.Errorf("certificate (CN %q, DNS names %q) names no member of the cluster", cert.Subject.CommonName, cert.DNSNames)
	default:
		return 0, fmt.Errorf("certificate names several members (%q): a node certificate must name exactly one", named)
	}
}

// peerCredential refuses a certificate not meant for peers: one without both the serverAuth and the
// clientAuth extended key usages (listed explicitly; a certificate with no such extension, which Go
// would accept for any use, is refused too), or one outside the allowed CNs and host names.
func (t *Transport) peerCredential(cert *x509.Certificate) error {
	if !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return fmt.Errorf("certificate (CN %q) is not a peer certificate: a member's certificate must list both the serverAuth and "+
			"the clientAuth extended key usages (a client certificate cannot open a peer link)", cert.Subject.CommonName)
	}
	if cns := t.cfg.AllowedCNs; len(cns) > 0 && !slices.Contains(cns, cert.Subject.CommonName) {
		return fmt.Errorf("certificate CN %q is not among the allowed peer CNs %q", cert.Subject.CommonName, cns)
	}
	if hosts := t.cfg.AllowedHostnames; len(hosts) > 0 && !slices.ContainsFunc(hosts, func(h string) bool { return cert.VerifyHostname(h) == nil }) {
		return fmt.Errorf("certificate (CN %q, DNS names %q) is valid for none of the allowed peer host names %q",
			cert.Subject.CommonName, cert.DNSNames, hosts)
	}
	return nil
}

// checkMember is a VerifyConnection step that refuses a verified certificate naming no member (want 0)
// or not the member want.
func (t *Transport) checkMember(cs tls.ConnectionState, want uint64) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("tls: the peer presented no certificate")
	}
	id, err := t.memberOf(cs.PeerCertificates[0])
	if err != nil {
		return fmt.Errorf("tls: %w", err)
	}
	if want != 0 && id != want {
		return fmt.Errorf("tls: certificate names member %s, but this connection is to member %s",
			leasepb.FormatID(id), leasepb.FormatID(want))
	}
	return nil
}

// withMemberCheck returns a copy of c that runs c's own VerifyConnection, then checkMember.
func (t *Transport) withMemberCheck(c *tls.Config, want uint64) *tls.Config {
	c = c.Clone()
	base := c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if base != nil {
			if err := base(cs); err != nil {
				return err
			}
		}
		return t.checkMember(cs, want)
	}
	return c
}

// serverTLS is Config.TLS for the serving side: client certificates required, and naming a member. A
// configuration that picks its settings per handshake (GetConfigForClient, as tlsfiles does) gets the
// check added to each configuration it returns.
func (t *Transport) serverTLS() *tls.Config {
	c := t.cfg.TLS.Clone()
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			sc, err := get(hello)
			if err != nil || sc == nil {
				return sc, err
			}
			sc = t.withMemberCheck(sc, 0)
			sc.ClientAuth = tls.RequireAndVerifyClientCert
			return sc, nil
		}
		return c
	}
	c = t.withMemberCheck(c, 0)
	c.ClientAuth = tls.RequireAndVerifyClientCert
	return c
}

// dialTLS is Config.TLS for dialing peer id (gRPC or a link): TLS 1.2 at least, checking that the
// server's certificate names that very member.
func (t *Transport) dialTLS(id uint64) *tls.Config {
	c := t.withMemberCheck(t.cfg.TLS, id)
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	return c
}

// dialCredentials are the gRPC credentials for dialing peer id (dialTLS).
func (t *Transport) dialCredentials(id uint64) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(t.dialTLS(id)))
}

// streamMember is the raft id of the member on the other end of an inbound call: 0 without TLS (no
// identity to check), an error when TLS is on and the call carries no member certificate (the handshake
// should have refused it already; this is the second lock).
func (t *Transport) streamMember(ctx context.Context) (uint64, error) {
	if t.cfg.TLS == nil {
		return 0, nil
	}
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return 0, status.Error(codes.Unauthenticated, "no peer information on a TLS peer port")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return 0, status.Error(codes.Unauthenticated, "the peer port requires a verified member certificate")
	}
	return t.memberOfState(info.State)
}

// memberOfState is the raft id of the member whose verified certificate secured cs.
func (t *Transport) memberOfState(cs tls.ConnectionState) (uint64, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return 0, status.Error(codes.Unauthenticated, "the peer port requires a verified member certificate")
	}
	id, err := t.memberOf(cs.VerifiedChains[0][0])
	if err != nil {
		return 0, status.Error(codes.PermissionDenied, err.Error())
	}
	return id, nil
}

// rejected tells Config.OnRejected of count inbound messages dropped for reason.
func (t *Transport) rejected(reason string, count int) {
	t.stats.rejected.Add(uint64(count))
	if f := t.cfg.OnRejected; f != nil && count > 0 {
		f(reason, count)
	}
}

// listenerTLS is the serving side's TLS: serverTLS, offering linkALPN before gRPC's "h2" (a gRPC client
// offers only "h2", an older node's link dialer never dials).
func (t *Transport) listenerTLS() *tls.Config {
	return tlsfiles.WithALPN(t.serverTLS(), linkALPN, "h2")
}

// linkTLS is Config.TLS for dialing a link to member id at addr: the member check, linkALPN, and the
// address's host as the server name, as gRPC's own TLS dial sets it.
func (t *Transport) linkTLS(id uint64, addr string) *tls.Config {
	c := t.dialTLS(id)
	c.NextProtos = []string{linkALPN}
	if c.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			c.ServerName = host
		}
	}
	return c
}
