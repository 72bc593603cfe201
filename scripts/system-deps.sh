#!/usr/bin/env bash
# Debian packages the test suite drives for real (no-op when present):
#   nginx     the load balancer of the failover test (tests/suites/test_failover.py)
#   chromium  the headless browser of the playground test (tests/server/api/test_playground.py)
#   prometheus  the server and promtool of the Prometheus tests (tests/suites/test_prometheus.py): scrape,
#               queries, `promtool check metrics` and `promtool test rules` on deploy/prometheus/
#   podman, runc, catatonit, debootstrap  build and run the image without Docker or a registry
#               (scripts/build-image.sh; tests/suites/test_container.py, test_compose.py, test_kube_play.py):
#               runc where crun refuses hybrid cgroups, catatonit for the pods of `podman kube play`, debootstrap
#               for a Debian base when python:3.11-slim cannot be pulled
#   golang-github-containernetworking-plugin-dnsname  the CNI plugin by which the containers of
#               `podman-compose up` (tests/suites/test_compose.py) find each other by service name (nginx's
#               upstream `normserve`), where podman's network backend is CNI (Debian 12's podman 4.3)
set -euo pipefail
need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v catatonit >/dev/null 2>&1 || [ -x /usr/libexec/podman/catatonit ] || need+=(catatonit)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
[ -x /usr/lib/cni/dnsname ] || need+=(golang-github-containernetworking-plugin-dnsname)
if ((${#need[@]})); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
