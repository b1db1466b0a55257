// Package tlsfiles serves TLS from certificate, key and CA files that it re-reads when they change, so
// that rotating a certificate needs no restart.
//
// # Basics
//
// A Source loads a certificate, its key and (optionally) a CA bundle when it is created; a file that is
// missing or does not parse is an error then. Afterwards, every handshake asks the Source for the
// current material, and the Source looks at the files' size and modification time at most once per
// CheckInterval (a stat, no read). When one changed it reloads all three; if the new set does not
// parse, or the key does not match the certificate, it logs the error and keeps serving the last good
// set, and tries again at the next change.
//
// # Caveats
//
//   - Replace files atomically (write a temporary file, then rename it), or write the key before the
//     certificate: a reload that catches a certificate and a key from different pairs fails (and is
//     retried at the next change), it never serves a mismatched pair.
//   - Connections already established keep the certificate they were made with; only new handshakes see
//     a new one.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// CheckInterval is the longest a changed file goes unnoticed by new handshakes.
const CheckInterval = time.Second

// Files names the files of one TLS identity. CAFile may be empty where no peer is verified.
type Files struct {
	CertFile, KeyFile, CAFile string
}

// Source is the current TLS material of one Files set. It is safe for concurrent use.
type Source struct {
	files Files
	log   *slog.Logger
	now   func() time.Time

	mu      sync.Mutex
	checked time.Time
	stamps  [3]stamp
	cert    *tls.Certificate
	pool    *x509.CertPool // nil without a CA file
}

// stamp is what a stat says of a file; a change of either means the file changed.
type stamp struct {
	size  int64
	mtime time.Time
}

// New loads f. It fails, naming the file, if a file is missing or does not parse.
func New(f Files, log *slog.Logger) (*Source, error) {
	if f.CertFile == "" || f.KeyFile == "" {
		return nil, errors.New("both a certificate file and a key file are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: f, log: log, now: time.Now}
	stamps, err := s.stat()
	if err != nil {
		return nil, err
	}
	cert, pool, err := load(f)
	if err != nil {
		return nil, err
	}
	s.stamps, s.cert, s.pool, s.checked = stamps, cert, pool, s.now()
	return s, nil
}

// Current is the certificate and CA pool new handshakes use, reloading them first if a file changed.
func (s *Source) Current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := s.now(); now.Sub(s.checked) >= CheckInterval {
		s.checked = now
		s.reloadIfChanged()
	}
	return s.cert, s.pool
}

// reloadIfChanged reloads the files when a stat differs from the last one. Called with mu held.
func (s *Source) reloadIfChanged() {
	stamps, err := s.stat()
	if err != nil {
		if stamps != s.stamps { // log once per change, not every second
			s.log.Error("tls files unreadable; keeping the last good certificate", "err", err)
			s.stamps = stamps
		}
		return
	}
	if stamps == s.stamps {
		return
	}
	s.stamps = stamps
	cert, pool, err := load(s.files)
	if err != nil {
		s.log.Error("tls files changed but do not load; keeping the last good certificate", "err", err)
		return
	}
	s.cert, s.pool = cert, pool
	s.log.Info("tls certificate reloaded", "cert_file", s.files.CertFile, "serial", cert.Leaf.SerialNumber.String(),
		"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
}

func (s *Source) stat() ([3]stamp, error) {
	var out [3]stamp
	var errs []error
	for i, path := range []string{s.files.CertFile, s.files.KeyFile, s.files.CAFile} {
		if path == "" {
			continue
		}
		fi, err := os.Stat(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out[i] = stamp{size: fi.Size(), mtime: fi.ModTime()}
	}
	return out, errors.Join(errs...)
}

// load reads and checks one set of files.
func load(f Files) (*tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("certificate %s with key %s: %w", f.CertFile, f.KeyFile, err)
	}
	// Leaf is set by LoadX509KeyPair since Go 1.23; parse it when an older behaviour left it nil.
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, nil, fmt.Errorf("certificate %s: %w", f.CertFile, err)
		}
	}
	if f.CAFile == "" {
		return &cert, nil, nil
	}
	raw, err := os.ReadFile(f.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw) {
		return nil, nil, fmt.Errorf("CA file %s holds no PEM certificate", f.CAFile)
	}
	return &cert, pool, nil
}

// ServerConfig serves the current certificate (TLS 1.2 minimum). With auth tls.RequireAndVerifyClientCert
// (or VerifyClientCertIfGiven) client certificates are verified against the current CA pool, which
// Files.CAFile must then name.
func (s *Source) ServerConfig(auth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Only the per-handshake configuration below counts; this one says what it does for those who
		// inspect it (server.Config.Validate).
		ClientAuth: auth,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := s.Current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*cert},
				ClientCAs:    pool,
				ClientAuth:   auth,
			}, nil
		},
	}
}

// PeerConfig is one configuration for both ends of mutual TLS between nodes: serving, it presents the
// current certificate and requires a client certificate signed by the current CA pool; dialing, it
// presents the current certificate and verifies the server's chain against the current pool.
//
// Dialing, it does not check the server's host name: nodes are identified by member name, not address,
// and the caller must check that the verified certificate names the member it meant to reach (the
// transport does, in its own VerifyConnection, which runs after this one's).
func (s *Source) PeerConfig() *tls.Config {
	c := s.ServerConfig(tls.RequireAndVerifyClientCert)
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		cert, _ := s.Current()
		return cert, nil
	}
	// The standard verification uses a fixed RootCAs; the pool changes with the CA file, so the chain
	// is verified here instead, against the pool current at this handshake.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		_, pool := s.Current()
		return VerifyChain(cs.PeerCertificates, pool, x509.ExtKeyUsageServerAuth)
	}
	return c
}

// VerifyChain checks that certs (leaf first, as a handshake presents them) chain to a root in pool and
// that the leaf allows usage. It checks no name.
func VerifyChain(certs []*x509.Certificate, pool *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(certs) == 0 {
		return errors.New("tls: the peer presented no certificate")
	}
	if pool == nil {
		return errors.New("tls: no CA pool to verify the peer's certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// WithALPN returns a copy of c that offers protos by ALPN, on every handshake: a configuration that
// picks its settings per handshake (GetConfigForClient, as a Source's does) gets protos set on each
// configuration it returns, so certificates and client-certificate rules stay whatever c decides.
func WithALPN(c *tls.Config, protos ...string) *tls.Config {
	c = c.Clone()
	c.NextProtos = protos
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(hello)
			if err != nil || cc == nil {
				return cc, err
			}
			cc = cc.Clone()
			cc.NextProtos = protos
			return cc, nil
		}
	}
	return c
}
