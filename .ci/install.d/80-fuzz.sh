#!/usr/bin/env bash
# cargo-fuzz for scripts/fuzz (fuzz/): pinned, built from crates.io with its
# own lockfile; skipped when this version is already installed. libFuzzer
# itself comes with the libfuzzer-sys crate (fuzz/Cargo.lock) and is compiled
# with the fuzz targets.
# ci: background (no apt-get, no pip: .ci/run runs it beside the others)
set -euo pipefail
want=0.13.2
if [ "$(cargo fuzz --version 2>/dev/null | awk '{print $2}')" != "$want" ]; then
    cargo install cargo-fuzz --version "$want" --locked
fi
cargo fuzz --version
