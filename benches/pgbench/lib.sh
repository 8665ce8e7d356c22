# Shared by benches/pgbench/run and benches/pgbench/backend-memory: a
# throwaway PostgreSQL server of its own, in a mktemp directory, on a free
# loopback port (TCP on 127.0.0.1 only, its socket in that directory),
# stopped and removed when the calling script exits.
#
# Binaries: $PG_BINDIR, else `pg_config --bindir` ($PG_CONFIG, default
# /usr/lib/postgresql/15/bin/pg_config). As root (initdb refuses root) the
# server runs as the `postgres` system user through runuser.
# The extension must be installed into that server first:
#   scripts/install-pg-extension --release

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PG_BINDIR=${PG_BINDIR:-$("$PG_CONFIG" --bindir)}
PSQL="$PG_BINDIR/psql"
PGBENCH="$PG_BINDIR/pgbench"

if [ "$(id -u)" = 0 ]; then
    PG_USER=${PG_USER:-postgres}
    as_pg() { runuser -u "$PG_USER" -- "$@"; }
else
    as_pg() { "$@"; }
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pg_stop() {
    if [ -n "${PG_ROOT:-}" ] && [ -d "$PG_ROOT" ]; then
        if [ -f "$PG_ROOT/data/postmaster.pid" ]; then
            as_pg "$PG_BINDIR/pg_ctl" -w -D "$PG_ROOT/data" -m fast stop >/dev/null 2>&1 \
                || as_pg "$PG_BINDIR/pg_ctl" -w -D "$PG_ROOT/data" -m immediate stop >/dev/null 2>&1 \
                || true
        fi
        rm -rf "$PG_ROOT"
    fi
}

# pg_start [extra postgres -c settings…]: initdb and start; sets PG_ROOT,
# PGHOST, PGPORT, PGUSER, PGDATABASE for psql and pgbench.
pg_start() {
    PG_ROOT=$(mktemp -d /tmp/fencecheck-pgbench.XXXXXX)
    trap pg_stop EXIT
    trap 'exit 130' INT TERM
    [ "$(id -u)" = 0 ] && chown "$PG_USER" "$PG_ROOT"
    as_pg "$PG_BINDIR/initdb" -A trust -U postgres -E UTF8 -D "$PG_ROOT/data" >"$PG_ROOT/initdb.log" 2>&1 \
        || { cat "$PG_ROOT/initdb.log" >&2; return 1; }
    PGPORT=$(free_port)
    local opts="-p $PGPORT -k $PG_ROOT -c listen_addresses=127.0.0.1"
    local s
    for s in "$@"; do opts="$opts -c $s"; done
    as_pg "$PG_BINDIR/pg_ctl" -w -t 60 -D "$PG_ROOT/data" -l "$PG_ROOT/server.log" -o "$opts" start >/dev/null \
        || { cat "$PG_ROOT/server.log" >&2; return 1; }
    export PGHOST=127.0.0.1 PGPORT PGUSER=postgres PGDATABASE=postgres
    PG_POSTMASTER_PID=$(head -1 "$PG_ROOT/data/postmaster.pid")
}

# q SQL: one value (or rows, |-separated), no headers.
q() { "$PSQL" -X -q -At -v ON_ERROR_STOP=1 -c "$1"; }
