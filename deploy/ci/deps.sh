#!/usr/bin/env bash
# Installs what sluice's tests need on a Debian machine, when it is missing:
# redis-server (the tests start their own servers on free loopback ports).
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian starts redis-server as a service on 6379; the tests do not use it.
redis-server --version
