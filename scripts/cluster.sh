#!/usr/bin/env bash
# cluster.sh — build leased into ./bin and run a local three-node cluster in the foreground (`make cluster`).
#
# Node i (1..3) is named n<i>, keeps its data in ./data/n<i> and listens on 127.0.0.1:
#   clients (gRPC) 710<i>    peers (raft) 720<i>    admin HTTP 740<i> (/healthz, /readyz)
#   clients (HTTP/JSON, docs/http.md) 750<i>
# (730<i> is reserved for gossip.) Re-running it restarts the same cluster on the same data; `make clean`
# removes the data. Every log line is prefixed with its node's name ("n1 | ..."). The audit trail (a line
# per grant, release and expiry, written by the leader) goes to ./data/n<i>.audit.log, not the terminal,
# so that `leasectl bench` leaves it readable: `tail -f data/n*.audit.log` follows it, and
# `scripts/cluster.sh --audit-log=stderr` puts it back in the terminal.
#
# Ctrl-C (SIGINT) or SIGTERM stops all three: SIGTERM (a clean shutdown: the leader hands leadership on),
# then SIGKILL for any node still running after GRACE seconds (default 10). The script exits 0 when every node
# stopped cleanly, 1 otherwise.
#
# If a node exits on its own, the script reports it (name, pid, exit status) and keeps the other two
# running: two of three is still a working cluster, and watching the failover is the point of a local
# cluster. Restart the lost node by hand with the command printed at startup. The script ends when Ctrl-C
# arrives or when no node is left.
#
# Extra arguments are passed to every node, e.g. `scripts/cluster.sh --log-level=debug`.
#
# --tls (first argument) turns on TLS on the client and peer ports, with client certificates required and
# a separate CA for peers: certificates are made by scripts/certs.sh in ./data/certs (once; delete the directory for new ones, or
# re-run certs.sh there to rotate them while the cluster runs), and the ACL of scripts/acl.example.yaml
# (alice: leases under jobs/; bob: read only; ops: admin). Talk to it with
#   leasectl --cacert data/certs/ca.crt --cert data/certs/alice.crt --key data/certs/alice.key acquire jobs/a --ttl 30s
#   curl --cacert data/certs/ca.crt --cert data/certs/alice.crt --key data/certs/alice.key https://127.0.0.1:7501/v1/leases/jobs/a
set -euo pipefail
cd "$(dirname "$0")/.."

tls_args() { :; }
if [[ ${1:-} == --tls ]]; then
	shift
	CERTS=data/certs
	[[ -f $CERTS/ca.crt && -f $CERTS/peer-ca.crt ]] || scripts/certs.sh "$CERTS"
	tls_args() { # tls_args NAME: the certificate flags of node NAME (peers have a CA of their own)
		printf '%s\n' --cert-file "$CERTS/$1.crt" --key-file "$CERTS/$1.key" --trusted-ca-file "$CERTS/ca.crt" \
			--client-cert-auth --peer-cert-file "$CERTS/peer/$1.crt" --peer-key-file "$CERTS/peer/$1.key" \
			--peer-trusted-ca-file "$CERTS/peer-ca.crt" --peer-cert-allowed-cn n1,n2,n3 \
			--initial-acl-file scripts/acl.example.yaml
	}
fi

GRACE=${GRACE:-10}
GO=${GO:-go}
BIN=bin/leased
NODES=(n1 n2 n3)
INITIAL=n1=127.0.0.1:7201,n2=127.0.0.1:7202,n3=127.0.0.1:7203

# The version is what the Go build information records, as for make build and the Dockerfile; VERSION
# overrides it the same way (cmd/internal/buildinfo).
ldflags=()
if [[ -n ${VERSION:-} ]]; then
	ldflags=(-ldflags "-X github.com/leased/leased/cmd/internal/buildinfo.version=$VERSION")
fi
echo "building $BIN"
"$GO" build "${ldflags[@]}" -o "$BIN" ./cmd/leased
"$BIN" --version

declare -A pid=() # name -> pid of the running leased
declare -A cmdline=()

# prefix copies its input to stdout with "name | " before every line. It ignores SIGINT and SIGTERM so that
# it outlives its node's last words (a node whose stderr pipe closed would die of SIGPIPE mid-shutdown);
# it ends at end of input, when its node has exited. awk reads its input in blocks and writes each line at
# once: a shell loop (which reads a pipe a byte at a time) or `sed -u` passed some 5,000 lines a second, and
# at info level every grant and expiry is a line on every node (docs/operations.md, "Audit trail"), so
# under load the pipe filled and the nodes, waiting to write their logs, stopped answering.
prefix() {
	trap '' INT TERM
	awk -v name="$1" '{ print name " | " $0; fflush() }'
}

start() {
	local i=$1 name=n$1
	mkdir -p "data/$name"
	local tls=()
	mapfile -t tls < <(tls_args "$name")
	local args=(--name "$name" --data-dir "data/$name"
		--client-addr "127.0.0.1:710$i" --peer-addr "127.0.0.1:720$i" --admin-addr "127.0.0.1:740$i" --http-addr "127.0.0.1:750$i"
		--initial-cluster "$INITIAL" --audit-log "data/$name.audit.log" "${tls[@]}" "${@:2}")
	cmdline[$name]="$BIN ${args[*]}"
	"$BIN" "${args[@]}" > >(prefix "$name") 2>&1 &
	pid[$name]=$!
}

stopping=0
stop_all() {
	((stopping)) && return
	stopping=1
	echo "stopping the cluster (SIGTERM; SIGKILL after ${GRACE}s)"
	local name
	for name in "${!pid[@]}"; do
		kill -TERM "${pid[$name]}" 2>/dev/null || true
	done
	local deadline=$((SECONDS + GRACE))
	for name in "${!pid[@]}"; do
		while kill -0 "${pid[$name]}" 2>/dev/null && ((SECONDS < deadline)); do
			sleep 0.1
		done
	done
	for name in "${!pid[@]}"; do
		if kill -0 "${pid[$name]}" 2>/dev/null; then
			echo "$name (pid ${pid[$name]}) did not stop within ${GRACE}s: SIGKILL"
			kill -KILL "${pid[$name]}" 2>/dev/null || true
		fi
	done
}

failed=0
# reported says how a node ended.
reported() {
	local name=$1 status=$2
	if ((stopping)); then
		if ((status != 0)); then
			echo "$name exited with status $status during shutdown"
			failed=1
		fi
	else
		echo "$name (pid ${pid[$name]}) exited unexpectedly with status $status; the other nodes keep running"
		echo "  restart it with: ${cmdline[$name]}"
		failed=1
	fi
	unset "pid[$name]"
}

# forget_gone reports, with an unknown status, the nodes that exited without wait -n seeing them.
forget_gone() {
	for name in "${!pid[@]}"; do
		if ! kill -0 "${pid[$name]}" 2>/dev/null; then
			echo "$name (pid ${pid[$name]}) is gone (exit status unknown)"
			((stopping)) || failed=1
			unset "pid[$name]"
		fi
	done
}

trap stop_all INT TERM

for i in 1 2 3; do
	start "$i" "$@"
done

echo "leased cluster started (data in ./data; Ctrl-C stops it)"
for i in 1 2 3; do
	echo "  n$i  pid ${pid[n$i]}  clients 127.0.0.1:710$i  peers 127.0.0.1:720$i  admin http://127.0.0.1:740$i/readyz  http/json 127.0.0.1:750$i"
done
echo "audit trail: data/n1.audit.log, data/n2.audit.log, data/n3.audit.log"
echo "client endpoints: 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 (HTTP/JSON: 127.0.0.1:7501..7503, docs/http.md)"

# Wait for the nodes to exit, one at a time. `wait -n` also returns (with no pid) when a trapped signal
# arrives; the trap has then stopped the nodes and the loop collects their statuses.
while ((${#pid[@]} > 0)); do
	ended='' status=0
	wait -n -p ended "${pid[@]}" || status=$?
	if [[ -z ${ended:-} ]]; then
		# A trapped signal; or (127) bash knows none of the pids as a job any more, and would answer the
		# same at once forever: forget the nodes that are gone.
		((status == 127)) && { forget_gone; sleep 0.1; }
		continue
	fi
	for name in "${!pid[@]}"; do
		if [[ ${pid[$name]} == "$ended" ]]; then
			reported "$name" "$status"
		fi
	done
done
wait # the log prefixers, which end once their node's output closes
if ((failed)); then
	exit 1
fi
echo "cluster stopped"
