#!/usr/bin/env bash
# Installs what sluice's tests need on a Debian machine, when it is missing:
# redis-server (the tests start their own servers on free loopback ports),
# redis-cli (redistest.Cluster creates its cluster with it; Debian's
# redis-tools, which redis-server normally pulls in) and a C compiler (the
# race detector needs cgo), and chromium (pipeline/replay's
# TestHTMLReportRenders opens the replay's HTML report in it, headless), with
# a font for its text.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-liberation)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian starts redis-server as a service on 6379; the tests do not use it.
redis-server --version
redis-cli --version
gcc --version | head -1
chromium --version
