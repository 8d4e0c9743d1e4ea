#!/usr/bin/env bash
# Install step: the Debian packages Daedalus runs with.
#   bubblewrap  the sandbox agents, agent tools and scripted-agent commands run in (bwrap)
#   chromium    the headless browser that tests render the HTML report and the API docs in
# Idempotent: does nothing when every package's command is already on PATH. Needs root (or sudo) and apt.
set -euo pipefail
declare -A COMMAND_OF=([bubblewrap]=bwrap [chromium]=chromium)
missing=()
for package in "${!COMMAND_OF[@]}"; do
  command -v "${COMMAND_OF[$package]}" >/dev/null 2>&1 || missing+=("$package")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "Daedalus needs the Debian packages: ${missing[*]}. Install them as root: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "Daedalus needs: ${missing[*]} (no apt-get here: install them with your system's package manager)" >&2
  exit 1
fi
echo "installing Debian packages: ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
