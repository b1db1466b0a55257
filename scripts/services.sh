#!/usr/bin/env bash
# services.sh — run a command with a throwaway PostgreSQL, MariaDB and Redis beside it.
#
# Usage: scripts/services.sh CMD [ARGS...]
#   e.g. scripts/services.sh go test -race ./client/fence/...
#
# What it does:
#   1. makes sure the PostgreSQL, MariaDB and Redis server binaries exist;
#      when one is missing and we run as root it runs `apt-get update` once
#      and then `apt-get install -y postgresql mariadb-server redis-server`
#      (Debian 12 and later);
#   2. starts a PostgreSQL (initdb in a temp dir, 127.0.0.1 only, random free
#      port, unix socket in the temp dir; run as the `postgres` user when we
#      are root, because postgres refuses to run as root), a MariaDB
#      (mariadb-install-db in a temp dir, 127.0.0.1 only, random free port,
#      unix socket in the temp dir, a database `leased_test`; run as the
#      `mysql` user when we are root) and a Redis (127.0.0.1, random free
#      port, no persistence);
#   3. waits, with a deadline, until each accepts connections;
#      It also starts a one-node Redis Cluster (cluster mode, every slot on
#      the one node), which refuses cross-slot scripts as a real cluster does;
#   4. exports LEASED_TEST_POSTGRES_DSN, LEASED_TEST_MARIADB_DSN (a
#      github.com/go-sql-driver/mysql DSN), LEASED_TEST_REDIS_ADDR and
#      LEASED_TEST_REDIS_CLUSTER_ADDR and runs CMD;
#   5. on any exit stops the servers and removes the temp dir, and exits
#      with CMD's exit status.
#
# A service that cannot be installed or started is reported with a loud
# warning and CMD runs without its variable: the tests then decide whether
# that is a skip (developer machine) or a failure (CI=true).
# A variable that is already set in the environment is kept as it is and the
# matching service is not started, so nesting this script is harmless and a
# developer can point the tests at a server of their own.
#
# Works non-interactively (no stdin), as root on a fresh Debian 12, and as an
# ordinary user when the binaries are already installed.

set -uo pipefail

readonly START_TIMEOUT_SECONDS=60
readonly PORT_ATTEMPTS=5

log() { printf 'services.sh: %s\n' "$*" >&2; }

warn() {
	printf '\n' >&2
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
	printf '!!! services.sh WARNING: %s\n' "$*" >&2
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
}

if [[ $# -eq 0 ]]; then
	echo "usage: $0 CMD [ARGS...]" >&2
	exit 2
fi

is_root() { [[ "$(id -u)" -eq 0 ]]; }

# ---------------------------------------------------------------------------
# Cleanup: registered before anything is started.

WORKDIR=""
REDIS_PID=""
REDIS_CLUSTER_PID=""
PG_DATA=""
PG_BIN=""
MARIADB_PID=""
MARIADB_PIDFILE=""
# shellcheck source=scripts/apt.sh
source "$(dirname "$(readlink -f "$0")")/apt.sh"

# run_as USER CMD...: runs CMD as USER when we are root, as ourselves otherwise.
run_as() {
	local user=$1
	shift
	if is_root; then
		if command -v runuser >/dev/null 2>&1; then
			runuser -u "$user" -- "$@"
		else
			# su needs one shell string; quote every argument.
			su -s /bin/sh "$user" -c "$(printf '%q ' "$@")"
		fi
	else
		"$@"
	fi
}

run_as_postgres() { run_as postgres "$@"; }

# stop_mariadb asks mariadbd to shut down (SIGTERM to the pid it wrote) and
# waits for it, with a deadline, before killing it.
stop_mariadb() {
	local pid=""
	[[ -n "$MARIADB_PIDFILE" ]] && pid="$(cat "$MARIADB_PIDFILE" 2>/dev/null)"
	[[ -n "$pid" ]] && kill "$pid" 2>/dev/null
	local deadline=$((SECONDS + 30))
	while [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
		sleep 0.1 # polling interval, not a wait for a condition
	done
	[[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null
	if [[ -n "$MARIADB_PID" ]]; then
		kill "$MARIADB_PID" 2>/dev/null
		wait "$MARIADB_PID" 2>/dev/null
	fi
	MARIADB_PID=""
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM HUP
	if [[ -n "$POLICY_RC_CREATED" ]]; then
		rm -f /usr/sbin/policy-rc.d
	fi
	if [[ -n "$REDIS_PID" ]]; then
		kill "$REDIS_PID" 2>/dev/null
		wait "$REDIS_PID" 2>/dev/null
	fi
	if [[ -n "$REDIS_CLUSTER_PID" ]]; then
		kill "$REDIS_CLUSTER_PID" 2>/dev/null
		wait "$REDIS_CLUSTER_PID" 2>/dev/null
	fi
	stop_mariadb
	if [[ -n "$PG_DATA" && -f "$PG_DATA/postmaster.pid" ]]; then
		if ! run_as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null 2>&1; then
			local pid
			pid="$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null)"
			[[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null
		fi
	fi
	if [[ -n "$WORKDIR" && -d "$WORKDIR" ]]; then
		rm -rf "$WORKDIR"
	fi
	exit "$rc"
}
trap cleanup EXIT

CMD_PID=""

# on_signal forwards a terminating signal to CMD, waits for it, and exits
# (which runs cleanup).
on_signal() {
	local code=$1
	if [[ -n "$CMD_PID" ]]; then
		kill -TERM "$CMD_PID" 2>/dev/null
		wait "$CMD_PID" 2>/dev/null
	fi
	exit "$code"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

# ---------------------------------------------------------------------------
# Installation.

# find_pg_bin prints the directory holding initdb, postgres and pg_ctl,
# preferring the newest /usr/lib/postgresql/<version>/bin.
find_pg_bin() {
	local dir
	for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [[ -x "$dir/initdb" && -x "$dir/postgres" && -x "$dir/pg_ctl" ]]; then
			echo "$dir"
			return 0
		fi
	done
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dir="$(dirname "$(readlink -f "$(command -v initdb)")")"
		if [[ -x "$dir/postgres" && -x "$dir/pg_ctl" ]]; then
			echo "$dir"
			return 0
		fi
	fi
	return 1
}

have_redis() { command -v redis-server >/dev/null 2>&1; }

# find_mariadbd prints the path of the MariaDB server binary (mariadbd, or
# mysqld in older packages).
find_mariadbd() {
	local bin
	for bin in mariadbd /usr/sbin/mariadbd mysqld /usr/sbin/mysqld; do
		if command -v "$bin" >/dev/null 2>&1; then
			command -v "$bin"
			return 0
		fi
	done
	return 1
}

have_mariadb() {
	find_mariadbd >/dev/null && command -v mariadb-install-db >/dev/null 2>&1 &&
		command -v mariadb >/dev/null 2>&1
}

# install_packages installs the given Debian packages (scripts/apt.sh), keeping apt from starting the
# packaged system-wide services (we start our own).
install_packages() {
	if ! is_root; then
		warn "not root: cannot install $* (install them yourself)"
		return 1
	fi
	apt_install "$@"
}

ensure_binaries() {
	local missing=()
	[[ -n "${LEASED_TEST_POSTGRES_DSN:-}" ]] || find_pg_bin >/dev/null || missing+=(postgresql)
	[[ -n "${LEASED_TEST_REDIS_ADDR:-}" ]] || have_redis || missing+=(redis-server)
	if [[ ${#missing[@]} -gt 0 ]]; then
		install_packages "${missing[@]}" || warn "could not install ${missing[*]}"
	fi
	# MariaDB on its own, so that a machine without it still gets the others.
	if [[ -z "${LEASED_TEST_MARIADB_DSN:-}" ]] && ! have_mariadb; then
		install_packages mariadb-server || warn "could not install mariadb-server"
	fi
}

# ---------------------------------------------------------------------------
# Ports and readiness.

# port_in_use reports whether something accepts TCP connections on the port.
port_in_use() {
	(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# free_port prints a random port in [20000, 60000) that nothing listens on.
# The caller retries on a lost race (someone else took it before we bound).
free_port() {
	local port i
	for i in $(seq 1 100); do
		port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
		if ! port_in_use "$port"; then
			echo "$port"
			return 0
		fi
	done
	return 1
}

# wait_until CHECK PID: polls CHECK until it succeeds, the process PID dies or
# the deadline passes.
wait_until() {
	local check=$1 pid=$2
	local deadline=$((SECONDS + START_TIMEOUT_SECONDS))
	while ((SECONDS < deadline)); do
		if "$check"; then
			return 0
		fi
		if ! kill -0 "$pid" 2>/dev/null; then
			return 1
		fi
		sleep 0.1 # polling interval, not a wait for a condition
	done
	return 1
}

# ---------------------------------------------------------------------------
# PostgreSQL.

PG_PORT=""

pg_ready() {
	"$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres 2>/dev/null
}

start_postgres() {
	PG_BIN="$(find_pg_bin)" || {
		warn "PostgreSQL server binaries not found: LEASED_TEST_POSTGRES_DSN stays unset"
		return 1
	}
	local dir="$WORKDIR/pg"
	mkdir -p "$dir/sock"
	if is_root; then
		if ! id postgres >/dev/null 2>&1; then
			warn "running as root but there is no 'postgres' user to run PostgreSQL as"
			return 1
		fi
		chown -R postgres: "$dir"
	fi
	if ! run_as_postgres "$PG_BIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 \
		--no-sync >"$dir/initdb.log" 2>&1; then
		warn "initdb failed: $(tail -n 5 "$dir/initdb.log")"
		return 1
	fi
	PG_DATA="$dir/data"
	local attempt pid
	for attempt in $(seq 1 "$PORT_ATTEMPTS"); do
		PG_PORT="$(free_port)" || break
		run_as_postgres "$PG_BIN/postgres" -D "$PG_DATA" -p "$PG_PORT" \
			-c listen_addresses=127.0.0.1 -c unix_socket_directories="$dir/sock" \
			-c fsync=off -c synchronous_commit=off -c full_page_writes=off \
			-c max_connections=200 >>"$dir/postgres.log" 2>&1 </dev/null &
		pid=$!
		if wait_until pg_ready "$pid"; then
			export LEASED_TEST_POSTGRES_DSN="postgres://postgres@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
			log "PostgreSQL ready on 127.0.0.1:$PG_PORT"
			return 0
		fi
		log "PostgreSQL did not start on port $PG_PORT (attempt $attempt)"
		kill "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	warn "PostgreSQL did not start: $(tail -n 5 "$dir/postgres.log" 2>/dev/null)"
	return 1
}

# ---------------------------------------------------------------------------
# MariaDB.

MARIADB_PORT=""
MARIADB_SOCK=""

mariadb_ready() {
	mariadb --no-defaults --socket="$MARIADB_SOCK" -u root -e 'SELECT 1' >/dev/null 2>&1
}

start_mariadb() {
	local server
	if ! have_mariadb || ! server="$(find_mariadbd)"; then
		warn "MariaDB server binaries not found: LEASED_TEST_MARIADB_DSN stays unset"
		return 1
	fi
	local dir="$WORKDIR/mariadb" user
	user="$(id -un)"
	mkdir -p "$dir/data"
	if is_root; then
		# mariadbd refuses to run as root without being told to; run it as
		# the package's own user.
		if ! id mysql >/dev/null 2>&1; then
			warn "running as root but there is no 'mysql' user to run MariaDB as"
			return 1
		fi
		user=mysql
		chown -R mysql: "$dir"
	fi
	# root@localhost and root@127.0.0.1 with an empty password, so that the
	# tests can connect over TCP.
	if ! run_as "$user" mariadb-install-db --no-defaults --datadir="$dir/data" \
		--auth-root-authentication-method=normal --skip-test-db \
		>"$dir/install.log" 2>&1 </dev/null; then
		warn "mariadb-install-db failed: $(tail -n 5 "$dir/install.log")"
		return 1
	fi
	MARIADB_SOCK="$dir/mysqld.sock"
	MARIADB_PIDFILE="$dir/mysqld.pid"
	local attempt
	for attempt in $(seq 1 "$PORT_ATTEMPTS"); do
		MARIADB_PORT="$(free_port)" || break
		run_as "$user" "$server" --no-defaults --datadir="$dir/data" \
			--port="$MARIADB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
			--socket="$MARIADB_SOCK" --pid-file="$MARIADB_PIDFILE" \
			--log-error="$dir/mariadb.log" --skip-log-bin \
			--innodb-buffer-pool-size=64M --innodb-flush-log-at-trx-commit=0 \
			--max-connections=200 </dev/null >/dev/null 2>&1 &
		MARIADB_PID=$!
		if wait_until mariadb_ready "$MARIADB_PID"; then
			if ! mariadb --no-defaults --socket="$MARIADB_SOCK" -u root \
				-e 'CREATE DATABASE IF NOT EXISTS leased_test' >>"$dir/install.log" 2>&1; then
				warn "cannot create the MariaDB test database: $(tail -n 5 "$dir/install.log")"
				return 1
			fi
			export LEASED_TEST_MARIADB_DSN="root@tcp(127.0.0.1:$MARIADB_PORT)/leased_test"
			log "MariaDB ready on 127.0.0.1:$MARIADB_PORT"
			return 0
		fi
		log "MariaDB did not start on port $MARIADB_PORT (attempt $attempt)"
		stop_mariadb
	done
	warn "MariaDB did not start: $(tail -n 5 "$dir/mariadb.log" 2>/dev/null)"
	return 1
}

# ---------------------------------------------------------------------------
# Redis.

REDIS_PORT=""

redis_ready() {
	if command -v redis-cli >/dev/null 2>&1; then
		[[ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" == "PONG" ]]
		return
	fi
	local reply
	reply="$(
		exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT" || exit 1
		printf 'PING\r\n' >&3
		IFS= read -r -t 1 line <&3 && printf '%s' "$line"
	)" 2>/dev/null
	[[ "$reply" == "+PONG"* ]]
}

start_redis() {
	if ! have_redis; then
		warn "redis-server not found: LEASED_TEST_REDIS_ADDR stays unset"
		return 1
	fi
	local dir="$WORKDIR/redis"
	mkdir -p "$dir"
	local attempt
	for attempt in $(seq 1 "$PORT_ATTEMPTS"); do
		REDIS_PORT="$(free_port)" || break
		redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$dir" \
			--save '' --appendonly no --daemonize no --protected-mode yes \
			--logfile "$dir/redis.log" </dev/null >/dev/null 2>&1 &
		REDIS_PID=$!
		if wait_until redis_ready "$REDIS_PID"; then
			export LEASED_TEST_REDIS_ADDR="127.0.0.1:$REDIS_PORT"
			log "Redis ready on $LEASED_TEST_REDIS_ADDR"
			return 0
		fi
		log "Redis did not start on port $REDIS_PORT (attempt $attempt)"
		kill "$REDIS_PID" 2>/dev/null
		wait "$REDIS_PID" 2>/dev/null
		REDIS_PID=""
	done
	warn "Redis did not start: $(tail -n 5 "$dir/redis.log" 2>/dev/null)"
	return 1
}

# A one-node Redis Cluster (cluster mode, all 16384 slots on the node): it
# refuses a script whose keys hash to different slots (CROSSSLOT) as a big
# cluster does, which is what redisfence's hash-tag tests need.

REDIS_CLUSTER_PORT=""

redis_cluster_ready() {
	redis-cli -h 127.0.0.1 -p "$REDIS_CLUSTER_PORT" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

# free_cluster_port prints a free port whose cluster bus port (port + 10000)
# is a valid port and free too.
free_cluster_port() {
	local port i
	for i in $(seq 1 20); do
		port="$(free_port)" || return 1
		if ((port + 10000 <= 65535)) && ! port_in_use $((port + 10000)); then
			echo "$port"
			return 0
		fi
	done
	return 1
}

redis_cluster_up() {
	[[ "$(redis-cli -h 127.0.0.1 -p "$REDIS_CLUSTER_PORT" ping 2>/dev/null)" == "PONG" ]]
}

start_redis_cluster() {
	if ! have_redis || ! command -v redis-cli >/dev/null 2>&1; then
		warn "redis-server or redis-cli not found: LEASED_TEST_REDIS_CLUSTER_ADDR stays unset"
		return 1
	fi
	local dir="$WORKDIR/redis-cluster"
	mkdir -p "$dir"
	local attempt
	for attempt in $(seq 1 "$PORT_ATTEMPTS"); do
		REDIS_CLUSTER_PORT="$(free_cluster_port)" || break
		redis-server --bind 127.0.0.1 --port "$REDIS_CLUSTER_PORT" --dir "$dir" \
			--cluster-enabled yes --cluster-config-file "$dir/nodes-$REDIS_CLUSTER_PORT.conf" \
			--save '' --appendonly no --daemonize no --protected-mode yes \
			--logfile "$dir/redis.log" </dev/null >/dev/null 2>&1 &
		REDIS_CLUSTER_PID=$!
		if wait_until redis_cluster_up "$REDIS_CLUSTER_PID" &&
			redis-cli -h 127.0.0.1 -p "$REDIS_CLUSTER_PORT" cluster addslotsrange 0 16383 >/dev/null 2>&1 &&
			wait_until redis_cluster_ready "$REDIS_CLUSTER_PID"; then
			export LEASED_TEST_REDIS_CLUSTER_ADDR="127.0.0.1:$REDIS_CLUSTER_PORT"
			log "Redis Cluster (one node) ready on $LEASED_TEST_REDIS_CLUSTER_ADDR"
			return 0
		fi
		log "Redis Cluster did not start on port $REDIS_CLUSTER_PORT (attempt $attempt)"
		kill "$REDIS_CLUSTER_PID" 2>/dev/null
		wait "$REDIS_CLUSTER_PID" 2>/dev/null
		REDIS_CLUSTER_PID=""
	done
	warn "Redis Cluster did not start: $(tail -n 5 "$dir/redis.log" 2>/dev/null)"
	return 1
}

# ---------------------------------------------------------------------------

main() {
	WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/leased-services.XXXXXX")" || {
		warn "cannot create a temp dir: running without services"
		WORKDIR=""
	}
	if [[ -n "$WORKDIR" ]]; then
		# The postgres and mysql users must be able to reach their data dirs inside.
		chmod 755 "$WORKDIR"
		ensure_binaries
		if [[ -n "${LEASED_TEST_POSTGRES_DSN:-}" ]]; then
			log "using the LEASED_TEST_POSTGRES_DSN already set"
		else
			start_postgres || unset LEASED_TEST_POSTGRES_DSN
		fi
		if [[ -n "${LEASED_TEST_MARIADB_DSN:-}" ]]; then
			log "using the LEASED_TEST_MARIADB_DSN already set"
		else
			start_mariadb || unset LEASED_TEST_MARIADB_DSN
		fi
		if [[ -n "${LEASED_TEST_REDIS_ADDR:-}" ]]; then
			log "using the LEASED_TEST_REDIS_ADDR already set"
		else
			start_redis || unset LEASED_TEST_REDIS_ADDR
		fi
		if [[ -n "${LEASED_TEST_REDIS_CLUSTER_ADDR:-}" ]]; then
			log "using the LEASED_TEST_REDIS_CLUSTER_ADDR already set"
		else
			start_redis_cluster || unset LEASED_TEST_REDIS_CLUSTER_ADDR
		fi
	fi
	# CMD runs in the background (stdin passed through) so that a signal to
	# this script is handled at once, forwarded to CMD, and followed by cleanup.
	"$@" <&0 &
	CMD_PID=$!
	wait "$CMD_PID"
	local rc=$?
	CMD_PID=""
	return "$rc"
}

main "$@"
