package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/leased/leased/server/tlsfiles"
)

// tlsOptions are the certificate flags, named as etcd names them. Each set of files is re-read when a
// file changes (server/tlsfiles), so rotation needs no restart.
type tlsOptions struct {
	certFile, keyFile, caFile         string
	clientCertAuth                    bool
	peerCertFile, peerKeyFile, peerCA string
	insecurePeer                      bool
	peerAllowedCNs, peerAllowedHosts  []string
	adminCertFile, adminKeyFile       string
	enablePprof                       bool
}

func addTLSFlags(fs *flag.FlagSet, o *tlsOptions) {
	fs.StringVar(&o.certFile, "cert-file", "", "`file` with the client port's TLS certificate (PEM); with --key-file, the client port serves TLS 1.2+")
	fs.StringVar(&o.keyFile, "key-file", "", "`file` with the key of --cert-file (PEM)")
	fs.StringVar(&o.caFile, "trusted-ca-file", "", "`file` of CA certificates (PEM) that client certificates must chain to (with --client-cert-auth)")
	fs.BoolVar(&o.clientCertAuth, "client-cert-auth", false, "require and verify client certificates on the client port (needs --cert-file, --key-file, --trusted-ca-file)")
	fs.StringVar(&o.peerCertFile, "peer-cert-file", "", "`file` with this node's peer certificate (PEM); its CN or a DNS SAN must be --name. Peer TLS is always mutual")
	fs.StringVar(&o.peerKeyFile, "peer-key-file", "", "`file` with the key of --peer-cert-file (PEM)")
	fs.StringVar(&o.peerCA, "peer-trusted-ca-file", "", "`file` of CA certificates (PEM) that peer certificates must chain to")
	fs.Var(namesFlag{&o.peerAllowedCNs}, "peer-cert-allowed-cn", "`names`,... a peer certificate's CN must be one of (default: any CN that names a member)")
	fs.Var(namesFlag{&o.peerAllowedHosts}, "peer-cert-allowed-hostname", "`names`,... a peer certificate must be valid for one of (a DNS or IP SAN; default: no such check)")
	fs.BoolVar(&o.insecurePeer, "insecure-peer", false, "allow a plaintext peer port on a non-loopback address (anyone who reaches it can forge raft traffic; a warning is logged at every start)")
	fs.StringVar(&o.adminCertFile, "admin-cert-file", "", "`file` with the admin HTTP port's TLS certificate (PEM); with --admin-key-file the admin port serves HTTPS")
	fs.StringVar(&o.adminKeyFile, "admin-key-file", "", "`file` with the key of --admin-cert-file (PEM)")
	fs.BoolVar(&o.enablePprof, "enable-pprof", false, "serve Go's profiler under /debug/pprof/ on the admin port")
}

// tlsConfigs turns the certificate flags into the node's TLS configurations, loading every file once:
// a missing or unparsable file is an error here, naming the flag.
type tlsConfigs struct {
	client, peer, admin *tls.Config
}

func buildTLS(o tlsOptions, log *slog.Logger) (tlsConfigs, error) {
	var out tlsConfigs
	var errs []error
	pair := func(cert, key, certFlag, keyFlag string) bool {
		if (cert == "") != (key == "") {
			errs = append(errs, fmt.Errorf("--%s and --%s go together", certFlag, keyFlag))
			return false
		}
		return cert != ""
	}
	if pair(o.certFile, o.keyFile, "cert-file", "key-file") {
		src, err := tlsfiles.New(tlsfiles.Files{CertFile: o.certFile, KeyFile: o.keyFile, CAFile: o.caFile}, log.With("tls", "client"))
		if err != nil {
			errs = append(errs, fmt.Errorf("client TLS (--cert-file, --key-file, --trusted-ca-file): %w", err))
		} else {
			auth := tls.NoClientCert
			if o.clientCertAuth {
				auth = tls.RequireAndVerifyClientCert
			}
			out.client = src.ServerConfig(auth)
		}
	}
	if o.clientCertAuth && (o.certFile == "" || o.caFile == "") {
		errs = append(errs, errors.New("--client-cert-auth needs --cert-file, --key-file and --trusted-ca-file"))
	}
	if o.caFile != "" && !o.clientCertAuth {
		errs = append(errs, errors.New("--trusted-ca-file is only used with --client-cert-auth; give both, or neither"))
	}
	if pair(o.peerCertFile, o.peerKeyFile, "peer-cert-file", "peer-key-file") {
		if o.peerCA == "" {
			errs = append(errs, errors.New("peer TLS is mutual: --peer-cert-file needs --peer-trusted-ca-file"))
		} else if src, err := tlsfiles.New(tlsfiles.Files{CertFile: o.peerCertFile, KeyFile: o.peerKeyFile, CAFile: o.peerCA}, log.With("tls", "peer")); err != nil {
			errs = append(errs, fmt.Errorf("peer TLS (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file): %w", err))
		} else {
			out.peer = src.PeerConfig()
		}
	} else if o.peerCA != "" {
		errs = append(errs, errors.New("--peer-trusted-ca-file needs --peer-cert-file and --peer-key-file"))
	}
	if out.peer == nil && len(o.peerAllowedCNs)+len(o.peerAllowedHosts) > 0 {
		errs = append(errs, errors.New("--peer-cert-allowed-cn and --peer-cert-allowed-hostname need peer TLS (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file)"))
	}
	if o.peerCA != "" && sameFile(o.peerCA, o.caFile) {
		log.Warn("--peer-trusted-ca-file and --trusted-ca-file are the same file: give peers a CA of their own, "+
			"so that a certificate made for a client can never be made into a member's (docs/security.md, \"Peer threat model\")",
			"file", o.peerCA)
	}
	if pair(o.adminCertFile, o.adminKeyFile, "admin-cert-file", "admin-key-file") {
		src, err := tlsfiles.New(tlsfiles.Files{CertFile: o.adminCertFile, KeyFile: o.adminKeyFile}, log.With("tls", "admin"))
		if err != nil {
			errs = append(errs, fmt.Errorf("admin TLS (--admin-cert-file, --admin-key-file): %w", err))
		} else {
			out.admin = src.ServerConfig(tls.NoClientCert)
		}
	}
	return out, errors.Join(errs...)
}

// sameFile reports whether a and b name one file, or two files with the same content.
func sameFile(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	if errA != nil || errB != nil {
		return false
	}
	if os.SameFile(fa, fb) {
		return true
	}
	ra, errA := os.ReadFile(a)
	rb, errB := os.ReadFile(b)
	return errA == nil && errB == nil && bytes.Equal(ra, rb)
}

// namesFlag parses a comma-separated list of names; given again, it adds to the list.
type namesFlag struct{ p *[]string }

func (f namesFlag) String() string {
	if f.p == nil {
		return ""
	}
	return strings.Join(*f.p, ",")
}

func (f namesFlag) Set(s string) error {
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name == "" {
			return fmt.Errorf("empty name in %q", s)
		}
		*f.p = append(*f.p, name)
	}
	return nil
}
