#!/usr/bin/env bash
# docker.sh — run a command with a Docker engine beside it, for the container test (tests/deploy,
# TestContainerImage).
#
# Usage: scripts/docker.sh CMD [ARGS...]
#   e.g. scripts/docker.sh go test -run TestContainerImage ./tests/deploy/
#
# What it does:
#   1. when `docker info` answers, runs CMD as it is (an engine of your own is used and left alone);
#   2. otherwise, as root: installs Debian's docker.io and docker-compose when dockerd or docker-compose
#      is missing (apt-get, as services.sh installs PostgreSQL), starts dockerd with its log in a temp
#      file, and waits, with a deadline, until `docker info` answers;
#   3. runs CMD, then stops the dockerd it started (images stay in /var/lib/docker, so the next run
#      builds from its cache) and exits with CMD's exit status.
#
# An engine that cannot be installed or started is reported with a loud warning and CMD runs anyway:
# the test then skips, loudly, or fails under CI=true.

set -uo pipefail

readonly START_TIMEOUT_SECONDS=60
readonly STOP_TIMEOUT_SECONDS=30

log() { printf 'docker.sh: %s\n' "$*" >&2; }

warn() {
	printf '\n!!! docker.sh WARNING: %s\n\n' "$*" >&2
}

if [[ $# -eq 0 ]]; then
	echo "usage: $0 CMD [ARGS...]" >&2
	exit 2
fi

# shellcheck source=scripts/apt.sh
source "$(dirname "$(readlink -f "$0")")/apt.sh"

DOCKERD_PID=""
DOCKERD_LOG=""

cleanup() {
	apt_restore_policy
	if [[ -n "$DOCKERD_PID" ]]; then
		log "stopping the dockerd it started (pid $DOCKERD_PID)"
		kill -TERM "$DOCKERD_PID" 2>/dev/null
		local i
		for ((i = 0; i < STOP_TIMEOUT_SECONDS * 10; i++)); do
			kill -0 "$DOCKERD_PID" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$DOCKERD_PID" 2>/dev/null
	fi
	[[ -n "$DOCKERD_LOG" ]] && rm -f "$DOCKERD_LOG"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

engine_up() { docker info >/dev/null 2>&1; }

# start_engine installs what is missing and starts dockerd; it fails with a message when it cannot.
start_engine() {
	if [[ "$(id -u)" -ne 0 ]]; then
		log "no Docker engine answers and not root: cannot install or start one"
		return 1
	fi
	if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker-compose >/dev/null 2>&1 ||
		! command -v docker >/dev/null 2>&1; then
		apt_install docker.io docker-compose || return 1
	fi
	DOCKERD_LOG=$(mktemp /tmp/dockerd.XXXXXX.log)
	log "starting dockerd (log: $DOCKERD_LOG)"
	dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
	DOCKERD_PID=$!
	local i
	for ((i = 0; i < START_TIMEOUT_SECONDS * 5; i++)); do
		engine_up && return 0
		if ! kill -0 "$DOCKERD_PID" 2>/dev/null; then
			DOCKERD_PID=""
			log "dockerd exited; its log:"
			tail -n 20 "$DOCKERD_LOG" >&2
			return 1
		fi
		sleep 0.2
	done
	log "dockerd did not answer within ${START_TIMEOUT_SECONDS}s; its log:"
	tail -n 20 "$DOCKERD_LOG" >&2
	return 1
}

if engine_up; then
	log "a Docker engine answers: using it"
elif ! start_engine; then
	warn "no Docker engine: the container test will skip (or fail under CI=true)"
fi

"$@"
exit $?
