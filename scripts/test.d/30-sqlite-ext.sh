#!/usr/bin/env bash
# The loadable SQLite extension (host/sqlite-ext) driven by clients no one
# here wrote: Python's sqlite3 module and the sqlite3 shell. Needs what
# .ci/install.d/30-sqlite.sh installs.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/common.sh

# `cargo test --workspace` (scripts/test) already built the library into
# deps/; this is then a no-op, and lets the script run on its own. The same
# package set keeps the same features, so nothing (wasmtime) is rebuilt.
cargo test --workspace --locked --no-run -q "${profile[@]}"
ext="$target_dir/$FENCECHECK_PROFILE/deps/libfencecheck_sqlite_ext.so"
[ -f "$ext" ] || { echo "not built: $ext" >&2; exit 1; }

passed=0 failed=0

# Debian's python3 explicitly: its sqlite3 module can load extensions.
if FENCECHECK_SQLITE_EXT="$ext" /usr/bin/python3 -m unittest -v \
    host/sqlite-ext/tests/python/test_extension.py; then
    passed=$((passed + 1))
else
    echo "FAIL python: host/sqlite-ext/tests/python/test_extension.py"
    failed=$((failed + 1))
fi

# The sqlite3 shell: each script's stdout and stderr must match its golden
# files exactly (outcomes, states in hex, error messages).
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for sql in host/sqlite-ext/tests/shell/*.sql; do
    golden="${sql%.sql}"
    rc=0
    sqlite3 -batch -cmd ".load $ext" :memory: <"$sql" >"$out/stdout" 2>"$out/stderr" || rc=$?
    # 1: the script's expected SQL errors; anything else (a signal) is a crash.
    if [ "$rc" -le 1 ] && diff -u "$golden.out" "$out/stdout" && diff -u "$golden.err" "$out/stderr"; then
        echo "ok   sqlite3 shell: $sql"
        passed=$((passed + 1))
    else
        echo "FAIL sqlite3 shell: $sql (exit $rc)"
        failed=$((failed + 1))
    fi
done

echo "sqlite-ext: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
