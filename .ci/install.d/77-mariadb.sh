#!/usr/bin/env bash
# The MariaDB UDF plugin (host/mariadb): Debian's MariaDB 10.11 server (its
# tests start their own mariadbd on free loopback ports with their own data
# directories, as the `mysql` user when run as root; the packaged service,
# if the package starts one, is not used) and libmariadb-dev (the headers
# of the UDF interface the plugin is built for).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends mariadb-server mariadb-client libmariadb-dev
/usr/sbin/mariadbd --version
