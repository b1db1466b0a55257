#!/usr/bin/env bash
# certs.sh DIR — make a throwaway certificate authority and certificates for a local leased cluster, with
# openssl (present on a stock Debian). NOT for production: keys are unencrypted and valid for 30 days.
#
#   DIR/ca.crt, ca.key              the client CA (--trusted-ca-file, leasectl --cacert)
#   DIR/n1.crt, n1.key ... n3       node certificates for the client and admin ports (--cert-file): CN and
#                                   DNS SAN = the member name, plus localhost and 127.0.0.1; serverAuth only
#   DIR/peer-ca.crt, peer-ca.key    the peer CA, a separate one (--peer-trusted-ca-file): a certificate made
#                                   for a client can never be made into a member's
#   DIR/peer/n1.crt, n1.key ... n3  peer certificates (--peer-cert-file): CN and DNS SAN = the member name,
#                                   plus localhost and 127.0.0.1; serverAuth and clientAuth, as the peer
#                                   port requires
#   DIR/alice, bob, ops .crt/.key   client certificates; the identity is the CN (leasectl --cert/--key)
#   DIR/expired.crt, expired.key    a client certificate that expired yesterday
#   DIR/stranger.crt, stranger.key  a client certificate from another CA (DIR/other-ca.crt)
#
# Re-running it replaces every file (a rotation: running nodes pick up new node certificates within a
# second, without a restart).
set -euo pipefail
dir=${1:?usage: scripts/certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ca() { # ca NAME: a self-signed CA in NAME.crt / NAME.key
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
		-subj "/O=leased local/CN=$1" -keyout "$1.key" -out "$1.crt" \
		-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}

# issue CA NAME EXT [DAYS_FROM DAYS_TO]: a certificate for NAME signed by CA, with the extensions EXT.
issue() {
	local ca=$1 name=$2 ext=$3
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$name" \
		-keyout "$tmp/$name.key" -out "$tmp/$name.csr" 2>/dev/null
	printf '%s\n' "$ext" >"$tmp/$name.ext"
	if [[ $# -ge 5 ]]; then # explicit validity: `openssl ca` takes dates (x509 -req does not before 3.4)
		: >"$tmp/index.txt"
		cat >"$tmp/ca.cnf" <<-CNF
			[ca]
			default_ca = local
			[local]
			database = $tmp/index.txt
			new_certs_dir = $tmp
			serial = $tmp/serial
			default_md = sha256
			policy = any
			unique_subject = no
			[any]
			commonName = supplied
		CNF
		openssl rand -hex 8 >"$tmp/serial"
		openssl ca -batch -config "$tmp/ca.cnf" -cert "$ca.crt" -keyfile "$ca.key" -in "$tmp/$name.csr" \
			-startdate "$4" -enddate "$5" -extfile "$tmp/$name.ext" -out "$tmp/$name.crt" -notext 2>/dev/null
	else
		openssl x509 -req -in "$tmp/$name.csr" -CA "$ca.crt" -CAkey "$ca.key" -set_serial "0x$(openssl rand -hex 8)" \
			-days 30 -extfile "$tmp/$name.ext" -out "$tmp/$name.crt" 2>/dev/null
	fi
	# Rename into place, key first, so a node re-reading its files never pairs a new key with an old cert
	# for long (server/tlsfiles retries at the next change).
	mv "$tmp/$name.key" "$name.key"
	mv "$tmp/$name.crt" "$name.crt"
}

client_ext='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth'

[[ -f ca.crt && -f ca.key ]] || ca ca
[[ -f peer-ca.crt && -f peer-ca.key ]] || ca peer-ca
[[ -f other-ca.crt && -f other-ca.key ]] || ca other-ca
mkdir -p peer
for n in n1 n2 n3; do
	issue ca "$n" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$n,DNS:localhost,IP:127.0.0.1"
	(cd peer && issue ../peer-ca "$n" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=DNS:$n,DNS:localhost,IP:127.0.0.1")
done
for c in alice bob ops; do
	issue ca "$c" "$client_ext"
done
issue other-ca stranger "$client_ext"
past_from=$(date -u -d '-3 days' +%Y%m%d%H%M%SZ)
past_to=$(date -u -d '-1 day' +%Y%m%d%H%M%SZ)
issue ca expired "$client_ext" "$past_from" "$past_to"
chmod 600 ./*.key peer/*.key
echo "certificates in $dir: ca.crt, n1..n3, alice, bob, ops, expired (client), stranger (other CA); peer-ca.crt, peer/n1..n3"
