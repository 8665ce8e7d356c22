#!/usr/bin/env bash
# etcd for the EtcdCoordinator tests and benchmark (host/authority): the tests
# start their own 3-member cluster from /usr/bin/etcd on free loopback ports;
# a packaged service that may start on 2379 is not used.
set -euo pipefail
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server
/usr/bin/etcd --version
