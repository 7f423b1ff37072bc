#!/usr/bin/env bash
# `make deps`: the system programs the test suite needs beyond Python and make. A no-op (silent, exit 0)
# when they are all there; on Debian as root (or with password-less sudo) it installs what is missing
# with apt-get; otherwise it stops with one line naming the missing packages and the command that
# installs them, so the suite never runs with its browser tests silently skipped.
set -euo pipefail

# command on PATH -> Debian package that provides it
REQUIRED=(
  "chromium:chromium"  # browser tests (Playwright drives Debian's Chromium; never a downloaded browser)
  "rg:ripgrep"         # the probe's fast grep engine, compared with its Python engine
  "git:git"            # the probe's git_diff / git_log
  "tmux:tmux"          # the real Claude Code CLI in interactive mode (mobile reply end to end)
  "npm:npm"            # installs that Claude Code CLI for the end-to-end test
  "ss:iproute2"        # shows which TCP connection carried a device-web stream (the relay's end-to-end test)
)
APT_GET=${AI1NET_APT_GET:-apt-get}
LOCK_WAIT_SECONDS=600  # how long to wait for another apt to finish

missing_packages() {
  local entry
  for entry in "${REQUIRED[@]}"; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || printf '%s\n' "${entry##*:}"
  done
}

mapfile -t missing < <(missing_packages)
[ ${#missing[@]} -eq 0 ] && exit 0

install_command="apt-get install -y ${missing[*]}"
if command -v "$APT_GET" >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    sudo=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
  else
    sudo=(none)
  fi
  if [ "${sudo[0]:-}" != none ]; then
    echo "make deps: installing ${missing[*]} ($install_command)"
    export DEBIAN_FRONTEND=noninteractive
    # A failed apt-get is judged by what is still missing afterwards, and told in the one line below.
    # Another apt may hold its locks (a fresh machine's first upgrade, a second `make` at the same time):
    # install waits for dpkg's lock; update does not wait for its lists' lock, so it is tried again.
    for ((try = 1; ; try++)); do
      err=$("${sudo[@]}" "$APT_GET" update -qq 2>&1 >/dev/null) && break
      [[ $err == *"Could not get lock"* || $err == *"Unable to lock"* ]] && ((try < LOCK_WAIT_SECONDS)) || break
      sleep 1
    done
    "${sudo[@]}" "$APT_GET" -o "DPkg::Lock::Timeout=$LOCK_WAIT_SECONDS" install -y -qq "${missing[@]}" \
      >/dev/null || true
    mapfile -t missing < <(missing_packages)
    [ ${#missing[@]} -eq 0 ] && exit 0
    install_command="apt-get install -y ${missing[*]}"
  fi
fi
echo "make deps: missing system package(s) ${missing[*]}: install them with 'sudo $install_command', then run make again" >&2
exit 1
