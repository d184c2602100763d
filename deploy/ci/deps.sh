#!/usr/bin/env bash
# Installs what sluice's tests need on a Debian machine, when it is missing:
# redis-server (the tests start their own servers on free loopback ports),
# redis-cli (redistest.Cluster creates its cluster with it; Debian's
# redis-tools, which redis-server normally pulls in), clickhouse-server (the
# analytics tests start their own on a free loopback port, through
# internal/clickhousetest; Debian 12's package is ClickHouse 18.16) with
# clickhouse-client, a C compiler (the race detector needs cgo), and chromium
# (replay's TestHTMLReportRenders opens the replay's HTML report in
# it, headless), with a font for its text; and python3 with
# python3-confluent-kafka, python3-protobuf and protoc, for a producer of
# decision records in another language; Debian's crowdsec (crowdsec and
# cscli, 1.4.6 on bookworm: the CrowdSec tests start their own Local API on a
# free loopback port with a throwaway configuration and database, through
# internal/crowdsectest); nginx and caddy (the gateway tests, cmd/sluice
# TestGateways*, start their own on loopback with throwaway configs) and
# iproute2 (TestOutsiderCannotReach makes network namespaces with ip); and
# Traefik, which Debian does not package, built once from its Go module
# (below).
set -euo pipefail
need=()
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
# Debian puts clickhouse-server in /usr/sbin, which a user's PATH may lack.
command -v clickhouse-server >/dev/null 2>&1 || [ -x /usr/sbin/clickhouse-server ] || need+=(clickhouse-server)
command -v clickhouse-client >/dev/null 2>&1 || need+=(clickhouse-client)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-liberation)
# The cross-language producer test (TestPipelineCommandPythonProducer):
# Debian's python3 with librdkafka's client and protobuf, and protoc.
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
/usr/bin/python3 -c 'import confluent_kafka, google.protobuf' >/dev/null 2>&1 ||
  need+=(python3 python3-confluent-kafka python3-protobuf)
# The gateways of the forward-auth tests. Debian puts nginx in /usr/sbin.
gateways_new=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || { need+=(nginx); gateways_new+=(nginx.service); }
command -v caddy >/dev/null 2>&1 || { need+=(caddy); gateways_new+=(caddy.service); }
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need+=(iproute2)
# crowdsec's postinst registers the machine with CrowdSec's Central API
# (cscli capi register) unless /etc/crowdsec/online_api_credentials.yaml
# exists and is not empty (the package's README.Debian). Without internet
# that registration fails, and with it the install: the file is written
# first, with a comment, which is how Debian says to decline.
crowdsec_new=""
if ! command -v crowdsec >/dev/null 2>&1 || ! command -v cscli >/dev/null 2>&1; then
  need+=(crowdsec)
  crowdsec_new=1
  capi=/etc/crowdsec/online_api_credentials.yaml
  if [ ! -s "$capi" ]; then
    $sudo mkdir -p /etc/crowdsec
    echo "# no Central API registration: sluice's deploy/ci/deps.sh (test machines have no internet)" | $sudo tee "$capi" >/dev/null
  fi
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Where systemd runs, the crowdsec package enables and starts
# crowdsec.service (a Local API on 127.0.0.1:8080, an agent reading the
# host's logs): the tests start their own, so one this script installed is
# stopped and disabled. Without systemd (containers, CI here) nothing starts.
if [ -n "$crowdsec_new" ] && [ -d /run/systemd/system ]; then
  $sudo systemctl disable --now crowdsec.service >/dev/null 2>&1 || true
fi
# Where systemd runs, the nginx and caddy packages start their services on
# port 80; the tests start their own, so those this script installed are
# stopped and disabled.
if [ ${#gateways_new[@]} -gt 0 ] && [ -d /run/systemd/system ]; then
  $sudo systemctl disable --now "${gateways_new[@]}" >/dev/null 2>&1 || true
fi
# Traefik (TestGatewaysTraefik): not a Debian package, so built from its Go
# module through the module proxy, once (some 5 minutes on 2 cores, then
# kept in /usr/local/bin). v3.6.12 is the newest whose dependencies the proxy
# serves (v3.7's need modules it refuses). Built in a copy of the module's
# own directory, since its go.mod replaces some dependencies, which
# `go install pkg@version` refuses.
TRAEFIK_VERSION=v3.6.12
if ! command -v traefik >/dev/null 2>&1; then
  GO=${GO:-go}
  echo "building traefik $TRAEFIK_VERSION from its Go module (once)"
  moddir=$(cd / && "$GO" mod download -json "github.com/traefik/traefik/v3@$TRAEFIK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$moddir" ] || { echo "go mod download of traefik $TRAEFIK_VERSION failed" >&2; exit 1; }
  src=$(mktemp -d)
  cp -r "$moddir/." "$src" && chmod -R u+w "$src"
  (cd "$src" && "$GO" build -trimpath -ldflags='-s -w' -o "$src/traefik.bin" ./cmd/traefik)
  $sudo install -m 0755 "$src/traefik.bin" /usr/local/bin/traefik
  rm -rf "$src"
fi
# Debian starts redis-server as a service on 6379, and clickhouse-server on
# 9000 where systemd runs; the tests use neither.
# The first line of a version banner with sed -n 1p, which reads to the end:
# `| head -1` under pipefail failed the script (141, SIGPIPE) about every other
# run when the tool wrote its next line after head had exited.
redis-server --version
redis-cli --version
clickhouse-client --version
gcc --version | sed -n 1p
chromium --version
protoc --version
crowdsec -version 2>&1 | sed -n 1p
{ command -v nginx >/dev/null && nginx -v; } 2>&1 || /usr/sbin/nginx -v 2>&1
caddy version
traefik version | sed -n 1p
