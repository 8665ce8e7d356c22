# Sourced by .ci/run and scripts/test: time each step, print one table.
#
#   source scripts/timing.sh
#   timed "cargo test" cargo test --workspace     # runs it; records its seconds and exit status
#   timing_table                                  # the table so far
#
# Steps append to $FENCECHECK_TIMINGS (a file .ci/run creates and exports,
# so scripts/test's steps land in the same table); without it, a file of
# this shell's own. A failing step still records its time, then its status
# is returned as the step's own.

if [ -z "${FENCECHECK_TIMINGS:-}" ]; then
    FENCECHECK_TIMINGS=$(mktemp "${TMPDIR:-/tmp}/fencecheck-timings.XXXXXX")
    export FENCECHECK_TIMINGS
fi

# timed NAME COMMAND...: run COMMAND, record NAME's wall seconds and status.
timed() {
    local name=$1 start status=0
    shift
    start=$(date +%s%N)
    "$@" || status=$?
    printf '%s\t%s\t%s\n' "$name" "$((($(date +%s%N) - start) / 1000000))" "$status" >>"$FENCECHECK_TIMINGS"
    return "$status"
}

# timing_table: every step recorded so far, in order, with their sum. The
# foreground steps do not overlap (scripts/test's are inside no other step);
# a step named "background: …" ran beside them (.ci/run's installers and
# fuzz build), so it is listed but not summed.
timing_table() {
    python3 - "$FENCECHECK_TIMINGS" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("| step | wall time | status |")
print("| --- | ---: | --- |")
total = 0.0
for name, millis, status in rows:
    s = int(millis) / 1000
    if not name.startswith("background:"):
        total += s
    print(f"| {name} | {int(s) // 60} min {s % 60:04.1f} s | {'ok' if status == '0' else 'exit ' + status} |")
print(f"| **total of the foreground steps** | **{int(total) // 60} min {total % 60:04.1f} s** | |")
EOF
}
