#!/usr/bin/env bash
# The SQLite extension is tested from clients no one here wrote: the sqlite3
# shell, and Debian's python3, whose sqlite3 module can load extensions (the
# pyenv Python first on PATH on these machines is built without that).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends sqlite3 python3
sqlite3 --version
/usr/bin/python3 -c 'import sqlite3; sqlite3.connect(":memory:").enable_load_extension(True)'
