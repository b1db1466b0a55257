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
# shellcheck source=scripts/apt.sh
source scripts/apt.sh

readonly RULES=deploy/prometheus/alerts.yaml
readonly TESTS=deploy/prometheus/alerts_test.yaml

log() { printf 'promtool.sh: %s\n' "$*" >&2; }

loud() {
	printf '\n' >&2
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
	printf '!!! promtool.sh %s\n' "$*" >&2
	printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
}

trap apt_restore_policy EXIT

find_promtool() {
	if [[ -n "${PROMTOOL:-}" ]]; then
		[[ -x "$PROMTOOL" ]] && echo "$PROMTOOL"
		return
	fi
	command -v promtool
}

# install_promtool installs Debian's prometheus package for its promtool, without starting the server.
install_promtool() {
	local ok=1
	apt_install prometheus || ok=0
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
