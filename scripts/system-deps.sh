#!/usr/bin/env bash
# Debian packages the test suite drives for real (no-op when present):
#   nginx     the load balancer of the failover test (tests/suites/test_failover.py)
#   chromium  the headless browser of the playground test (tests/server/api/test_playground.py)
#   prometheus  the server and promtool of the Prometheus tests (tests/suites/test_prometheus.py): scrape,
#               queries, `promtool check metrics` and `promtool test rules` on deploy/prometheus/
set -euo pipefail
need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
if ((${#need[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
