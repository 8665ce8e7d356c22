# Sourced by scripts/test and scripts/test.d/*: the build profile and the
# binaries the suites run.
#
#   profile     cargo's profile flags for FENCECHECK_PROFILE (debug, the
#               default, or release: .ci/run's, the build scripts/dist made)
#   target_dir  cargo's target directory
#   cli ARGS…   the fencecheck CLI: $FENCECHECK_CLI (the binary the
#               workspace build made; scripts/test exports it) or cargo run.
#               A `cargo run -p fencecheck-cli` resolves features for that
#               package alone and would compile its dependencies again.

export FENCECHECK_PROFILE=${FENCECHECK_PROFILE:-debug}
case "$FENCECHECK_PROFILE" in
    debug) profile=() ;;
    release) profile=(--release) ;;
    *) echo "FENCECHECK_PROFILE must be debug or release, not $FENCECHECK_PROFILE" >&2; exit 2 ;;
esac
target_dir=$(cargo metadata --locked --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')

cli() {
    if [ -n "${FENCECHECK_CLI:-}" ]; then
        "$FENCECHECK_CLI" "$@"
    else
        cargo run -q --locked "${profile[@]}" -p fencecheck-cli -- "$@"
    fi
}

# lint_in_build: true when cargo compiles the workspace's crates through
# clippy-driver with warnings denied (.ci/run sets this up): the builds are
# then the lint, and scripts/test skips its separate `cargo clippy` pass.
lint_in_build() {
    [ "$(basename "${RUSTC_WORKSPACE_WRAPPER:-}")" = clippy-driver ] &&
        [ "${CLIPPY_ARGS:-}" = -Dwarnings ]
}
