#!/usr/bin/env bash
# promtool.sh — check the Prometheus alerting rules in deploy/prometheus and run their unit tests.
#
# Usage: scripts/promtool.sh     (scripts/test.sh runs it in its default run, so CI does)
#
# What it does:
#   1. makes sure promtool exists; when it is missing and we run as root it runs `apt-get update` and
#      `apt-get install -y --no-install-recommends prometheus` (Debian's package ships /usr/bin/promtool),
#      with a policy-rc.d that keeps apt from starting the packaged Prometheus server;
#   2. runs `promtool check rules deploy/prometheus/alerts.yaml` and
#      `promtool test rules deploy/prometheus/alerts_test.yaml`, and exits non-zero if either fails.
#
# Without promtool (not root, or the install failed) it prints a loud SKIP and exits 0 on a developer
# machine; under CI=true a missing promtool is a failure (exit 1), as a missing PostgreSQL is for the
# fence tests. PROMTOOL=/path/to/promtool uses that binary instead of the one on PATH.

set -uo pipefail
cd "$(dirname "$0")/.."

readonly RULES=deploy/prometheus/alerts.yaml
readonly TESTS=deploy/prometheus/alerts_test.yaml

log() { printf 'promtool.sh: %s\n' "$*" >&2; }

loud() {
	printf '\n' >&2
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
	printf '!!! promtool.sh %s\n' "$*" >&2
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
}

POLICY_RC_CREATED=""
cleanup() {
	if [[ -n "$POLICY_RC_CREATED" ]]; then
		rm -f /usr/sbin/policy-rc.d
	fi
}
trap cleanup EXIT

find_promtool() {
	if [[ -n "${PROMTOOL:-}" ]]; then
		[[ -x "$PROMTOOL" ]] && echo "$PROMTOOL"
		return
	fi
	command -v promtool
}

# install_promtool installs Debian's prometheus package for its promtool, without starting the server.
install_promtool() {
	if [[ "$(id -u)" -ne 0 ]]; then
		log "not root: cannot install the prometheus package (apt-get install prometheus, or set PROMTOOL)"
		return 1
	fi
	if ! command -v apt-get >/dev/null 2>&1; then
		log "apt-get not found: cannot install the prometheus package"
		return 1
	fi
	# invoke-rc.d and deb-systemd-invoke ask policy-rc.d; 101 = "action forbidden", so the package's
	# postinst does not start a Prometheus server.
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		POLICY_RC_CREATED=1
	fi
	local apt=(apt-get -o DPkg::Lock::Timeout=300 -q)
	local ok=1
	log "installing the prometheus package (for promtool) with apt-get"
	if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" update </dev/null >&2; then
		ok=0
	elif ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends prometheus </dev/null >&2; then
		ok=0
	fi
	cleanup
	POLICY_RC_CREATED=""
	# On a machine that runs systemd the package also enables the service for the next boot: undo that,
	# we only wanted promtool.
	if [[ $ok -eq 1 && -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
		systemctl disable --now prometheus >/dev/null 2>&1 || true
	fi
	[[ $ok -eq 1 ]]
}

main() {
	local promtool
	if ! promtool="$(find_promtool)"; then
		install_promtool || true
		promtool="$(find_promtool)" || promtool=""
	fi
	if [[ -z "$promtool" ]]; then
		if [[ "${CI:-}" == "true" ]]; then
			loud "FAILURE: promtool not found and could not be installed (CI=true): the alerting rules are untested"
			return 1
		fi
		loud "SKIP: promtool not found: $RULES is NOT checked and $TESTS NOT run (run as root to install Debian's prometheus package, or set PROMTOOL)"
		return 0
	fi
	log "using $promtool ($("$promtool" --version 2>&1 | head -n 1))"
	"$promtool" check rules "$RULES" || return 1
	"$promtool" test rules "$TESTS" || return 1
}

main
