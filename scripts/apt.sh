# apt.sh — sourced by services.sh and promtool.sh: install Debian packages as root, without letting their
# postinst start the packaged system-wide services (the scripts start their own servers, or none).
#
# The caller defines log. POLICY_RC_CREATED is set while this file's policy-rc.d is in place, so that the
# caller's EXIT trap can remove it if the install is interrupted.

POLICY_RC_CREATED=""

# apt_install installs the given packages; it fails if not root or without apt-get.
apt_install() {
	if [[ "$(id -u)" -ne 0 ]]; then
		log "not root: cannot install $* (install them yourself)"
		return 1
	fi
	if ! command -v apt-get >/dev/null 2>&1; then
		log "apt-get not found: cannot install $*"
		return 1
	fi
	# invoke-rc.d and deb-systemd-invoke ask policy-rc.d; 101 = "action forbidden".
	if [[ ! -e /usr/sbin/policy-rc.d ]]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		POLICY_RC_CREATED=1
	fi
	local apt=(apt-get -o DPkg::Lock::Timeout=300 -q)
	local ok=1
	log "installing $* with apt-get"
	if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" update </dev/null >&2; then
		ok=0
	elif ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "$@" </dev/null >&2; then
		ok=0
	fi
	apt_restore_policy
	[[ $ok -eq 1 ]]
}

# apt_restore_policy removes the policy-rc.d apt_install put in place, if any.
apt_restore_policy() {
	if [[ -n "$POLICY_RC_CREATED" ]]; then
		rm -f /usr/sbin/policy-rc.d
		POLICY_RC_CREATED=""
	fi
}
