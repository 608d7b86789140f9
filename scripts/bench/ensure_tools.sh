#!/usr/bin/env bash
# Make sure the tools the SSH-node tests and the benchmark need are installed (Debian packages).
#   scripts/bench/ensure_tools.sh TOOL...     TOOL: sshd (openssh-server), fuser (psmisc), lsof (lsof), shellcheck,
#     prometheus and promtool (prometheus), alertmanager (prometheus-alertmanager), node_exporter (prometheus-node-exporter),
#     podman, catatonit (the init podman's --init runs)
# Exit 0 when every tool is there (installing what is missing with apt-get), 2 with the reason on
# stderr when it cannot be (not root, no apt-get, the install failed): callers skip on 2.
# No daemon is started: while apt-get runs, a policy-rc.d (exit 101, the Debian way) forbids
# maintainer scripts to start services, so installing openssh-server never starts a host sshd.
set -uo pipefail

declare -A package_of=([sshd]=openssh-server [fuser]=psmisc [lsof]=lsof [shellcheck]=shellcheck
  [prometheus]=prometheus [promtool]=prometheus [alertmanager]=prometheus-alertmanager
  [node_exporter]=prometheus-node-exporter [podman]=podman [catatonit]=catatonit)
declare -A path_of=([sshd]=/usr/sbin/sshd [fuser]=/usr/bin/fuser [lsof]=/usr/bin/lsof [shellcheck]=/usr/bin/shellcheck
  [prometheus]=/usr/bin/prometheus [promtool]=/usr/bin/promtool [alertmanager]=/usr/bin/prometheus-alertmanager
  [node_exporter]=/usr/bin/prometheus-node-exporter [podman]=/usr/bin/podman
  [catatonit]=/usr/libexec/podman/catatonit)

missing=()
for tool in "$@"; do
  [ -n "${package_of[$tool]:-}" ] || { echo "ensure_tools: unknown tool $tool (known: ${!package_of[*]})" >&2; exit 64; }
  [ -x "${path_of[$tool]}" ] || missing+=("${package_of[$tool]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0

cannot() { echo "ensure_tools: cannot install ${missing[*]}: $*" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || cannot "not root"
command -v apt-get >/dev/null || cannot "no apt-get (not a Debian-based system)"

policy=/usr/sbin/policy-rc.d
log=$(mktemp)
trap 'rm -f "$log"; [ -z "${own_policy:-}" ] || rm -f "$policy"' EXIT
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# ensure_tools.sh: no service starts while it installs packages\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  own_policy=1
fi
apt_get() {
  DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=120 "$@"
}
install_missing() {
  apt_get install --no-install-recommends "${missing[@]}" >>"$log" 2>&1
}
echo "ensure_tools: installing ${missing[*]}" >&2
# Package lists may be missing or stale on a fresh machine: update them once if the install fails.
if ! install_missing && ! { apt_get update >>"$log" 2>&1 && install_missing; }; then
  tail -5 "$log" >&2
  cannot "apt-get failed (log above)"
fi
for tool in "$@"; do
  [ -x "${path_of[$tool]}" ] || cannot "${path_of[$tool]} still missing after apt-get install"
done
exit 0
