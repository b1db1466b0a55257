#!/usr/bin/env bash
# zookeeper.sh — make sure ZooKeeper can run for bench-compare: when Debian's zookeeper package (ZooKeeper
# 3.8, /usr/share/java/zookeeper.jar) or a Java runtime is missing and we run as root, it installs the
# `zookeeper` and `default-jre` packages with apt-get, without letting their postinst start the packaged
# system-wide server (the comparison starts its own ensembles, as the invoking user, and stops them).
#
# Usage: bench/zookeeper.sh     (`make bench-bins` and scripts/test.sh run it)
#
# Exit 0 when ZooKeeper can run. Otherwise a loud message and exit 0 on a developer machine (the
# comparison then runs leased and etcd alone and says so), exit 1 under CI=true.

set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt.sh
source scripts/apt.sh

readonly JAR=/usr/share/java/zookeeper.jar

log() { printf 'zookeeper.sh: %s\n' "$*" >&2; }

loud() {
	printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
	printf '!!! zookeeper.sh %s\n' "$*" >&2
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
}

trap apt_restore_policy EXIT

present() { [[ -r "$JAR" ]] && command -v java >/dev/null 2>&1; }

main() {
	if present; then
		return 0
	fi
	apt_install zookeeper default-jre || true
	# On a machine that runs systemd the package may enable its service: the comparison wants none.
	if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
		systemctl disable --now zookeeper >/dev/null 2>&1 || true
	fi
	if present; then
		log "installed $(dpkg-query -W -f '${Package} ${Version}' zookeeper 2>/dev/null)"
		return 0
	fi
	if [[ "${CI:-}" == "true" ]]; then
		loud "FAILURE: ZooKeeper could not be installed (CI=true): its side of bench-compare is untested"
		return 1
	fi
	loud "SKIP: ZooKeeper not installed (run as root to install Debian's zookeeper and default-jre): bench-compare runs leased and etcd alone"
	return 0
}

main
