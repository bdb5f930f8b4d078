#!/usr/bin/env bash
# Create .venv and install adl-enforcer with its test tools. Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: Python 3.11 or newer is required (found $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
# libseccomp for the seccomp baseline.
# nftables for the egress filter (the agent namespace's capture rules); iproute2 for the tests' network lab.
missing=()
ldconfig -p | grep -q 'libseccomp\.so\.2' || missing+=(libseccomp2)
PATH="$PATH:/usr/sbin:/sbin" command -v nft >/dev/null || missing+=(nftables)
PATH="$PATH:/usr/sbin:/sbin" command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
  echo "setup: installing ${missing[*]} with apt-get" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null \
    || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev${EXTRAS:+,$EXTRAS}]"
