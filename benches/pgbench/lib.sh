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
# or FENCECHECK_SO names a fencecheck.so to load instead of the installed
# one: the server then runs from a private overlay of the installation
# (its own copies of postgres, initdb and pg_ctl, which find their share
# and lib directories relative to themselves; symbolic links to everything
# else but that library), so another install of the extension during the
# run cannot change what it measures.

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PG_BINDIR=${PG_BINDIR:-$("$PG_CONFIG" --bindir)}
SERVER_BINDIR=$PG_BINDIR
FENCECHECK_LIB="$("$PG_CONFIG" --pkglibdir)/fencecheck.so"
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
            as_pg "$SERVER_BINDIR/pg_ctl" -w -D "$PG_ROOT/data" -m fast stop >/dev/null 2>&1 \
                || as_pg "$SERVER_BINDIR/pg_ctl" -w -D "$PG_ROOT/data" -m immediate stop >/dev/null 2>&1 \
                || true
        fi
        rm -rf "$PG_ROOT"
    fi
}

# The overlay for FENCECHECK_SO, in $PG_ROOT/install.
pg_overlay() {
    local bindir sharedir libdir prefix root f
    bindir=$("$PG_CONFIG" --bindir)
    sharedir=$("$PG_CONFIG" --sharedir)
    libdir=$("$PG_CONFIG" --pkglibdir)
    # The directories' longest common prefix, as PostgreSQL relocates them.
    prefix=$(python3 -c 'import os, sys; print(os.path.commonpath(sys.argv[1:]))' "$bindir" "$sharedir" "$libdir")/
    root=$PG_ROOT/install
    mkdir -p "$root/${bindir#"$prefix"}" "$root/${libdir#"$prefix"}" "$root/${sharedir#"$prefix"}/extension"
    cp "$bindir/postgres" "$bindir/initdb" "$bindir/pg_ctl" "$root/${bindir#"$prefix"}/"
    for f in "$libdir"/*; do
        [ "${f##*/}" = fencecheck.so ] || ln -s "$f" "$root/${libdir#"$prefix"}/"
    done
    cp "$FENCECHECK_SO" "$root/${libdir#"$prefix"}/fencecheck.so"
    # Written back now: a mapped page still dirty in the page cache would
    # count as the backend's Private_Dirty (backend-memory).
    sync "$root/${libdir#"$prefix"}/fencecheck.so"
    for f in "$sharedir"/*; do
        [ "${f##*/}" = extension ] || ln -s "$f" "$root/${sharedir#"$prefix"}/"
    done
    for f in "$sharedir"/extension/*; do
        case "${f##*/}" in
            fencecheck.control|fencecheck--*) cp "$f" "$root/${sharedir#"$prefix"}/extension/" ;;
            *) ln -s "$f" "$root/${sharedir#"$prefix"}/extension/" ;;
        esac
    done
    SERVER_BINDIR=$root/${bindir#"$prefix"}
    FENCECHECK_LIB=$root/${libdir#"$prefix"}/fencecheck.so
}

# pg_start [extra postgres -c settings…]: initdb and start; sets PG_ROOT,
# PG_POSTMASTER_PID, and PGHOST, PGPORT, PGUSER, PGDATABASE for psql and
# pgbench.
pg_start() {
    PG_ROOT=$(mktemp -d /tmp/fencecheck-pgbench.XXXXXX)
    trap pg_stop EXIT
    trap 'exit 130' INT TERM
    [ "$(id -u)" = 0 ] && chown "$PG_USER" "$PG_ROOT"
    if [ -n "${FENCECHECK_SO:-}" ]; then
        pg_overlay
    fi
    as_pg "$SERVER_BINDIR/initdb" -A trust -U postgres -E UTF8 -D "$PG_ROOT/data" >"$PG_ROOT/initdb.log" 2>&1 \
        || { cat "$PG_ROOT/initdb.log" >&2; return 1; }
    PGPORT=$(free_port)
    local opts="-p $PGPORT -k $PG_ROOT -c listen_addresses=127.0.0.1"
    local s
    for s in "$@"; do opts="$opts -c $s"; done
    as_pg "$SERVER_BINDIR/pg_ctl" -w -t 60 -D "$PG_ROOT/data" -l "$PG_ROOT/server.log" -o "$opts" start >/dev/null \
        || { cat "$PG_ROOT/server.log" >&2; return 1; }
    export PGHOST=127.0.0.1 PGPORT PGUSER=postgres PGDATABASE=postgres
    PG_POSTMASTER_PID=$(head -1 "$PG_ROOT/data/postmaster.pid")
    echo "fencecheck.so: $FENCECHECK_LIB ($(stat -c %s "$FENCECHECK_LIB") bytes, md5 $(md5sum <"$FENCECHECK_LIB" | cut -c1-12))"
    if [ "$(stat -c %s "$FENCECHECK_LIB")" -gt 100000000 ]; then
        echo "WARNING: over 100 MB, probably a debug build (scripts/install-pg-extension --release)"
    fi
}

# q SQL: one value (or rows, |-separated), no headers.
q() { "$PSQL" -X -q -At -v ON_ERROR_STOP=1 -c "$1"; }
