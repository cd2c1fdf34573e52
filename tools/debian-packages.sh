#!/usr/bin/env bash
# Install the Debian packages some tests drive (strace, tmux, chromium...) when they are missing.
# `make test` calls this so a fresh machine (CI) needs no hand install. Each argument is
# "package" or "package:command" when the command differs from the package name.
set -euo pipefail
missing=()
for spec in "$@"; do
  pkg=${spec%%:*}; cmd=${spec#*:}
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] && ! command -v sudo >/dev/null; then
  echo "tools/debian-packages.sh: need root to install ${missing[*]}" >&2; exit 1
fi
SUDO=""; [ "$(id -u)" != 0 ] && SUDO=sudo
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
