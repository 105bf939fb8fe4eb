#!/usr/bin/env bash
# Run a spec's lr ladders to the end, keeping every finished trial in a second store as it goes
# (issue 33's long CPU work, which outlives any one machine):
#   1. `sweep run SPEC`, first copying what KEEP already holds (`--reuse`, on every run), so
#      nothing trains twice;
#   2. `sweep next SPEC --out`: one lr beyond each best at its ladder's edge, seeds at each best
#      strictly inside; run what it writes; again, until it writes nothing (or the same twice);
#   3. after every run, `sweep keep RESULTS/<sweep> KEEP` keeps the trials that
#      finished, so an interrupted session loses at most the trials running at the time.
#
#   tools/ladders.sh specs/families/families_ladders.yaml results docs/stores/families [sweep run options]
#
# KEEP is a store folder named after the spec's sweep (checked before anything runs). A copy that
# fails stops the loop: nothing more trains that could not be kept.
# Commit KEEP (its Parquet files; *.pt weights are ignored) to carry the study to the next machine.
set -u
if [ $# -lt 3 ]; then
    sed -n '2,15p' "$0"
    exit 2
fi
spec=$1 results=$2 keep=$3
shift 3
name=$(python -c "
import sys
from sweep.spec import SpecError, load_spec
try:
    print(load_spec(sys.argv[1]).name)
except SpecError as exc:  # a located message, no traceback
    sys.exit(str(exc))" "$spec") || exit 2
if [ "$(basename "$keep")" != "$name" ]; then
    echo "$keep: name the kept store after the sweep ($name), e.g. $(dirname "$keep")/$name" >&2
    exit 2
fi
next=$(mktemp -d)
trap 'rm -rf "$next"' EXIT

run() {  # run one spec (then sweep run's options), copying in what KEEP holds, then keep what finished
    local one=$1 reuse=()
    shift
    [ -d "$keep" ] && reuse=(--reuse "$keep")
    echo "== $(date '+%F %T') sweep run $one ${reuse[*]} $*"
    sweep run "$one" --results "$results" "${reuse[@]}" "$@"
    local rc=$?
    sweep keep "$results/$name" "$keep"
    local kept=$?
    if [ "$rc" -eq 2 ]; then  # bad input, or --stop-launching-at already past: nothing more will run
        echo "== $(date '+%F %T') sweep run refused (exit 2): stopping"
        exit 2
    fi
    if [ "$kept" -ne 0 ]; then
        echo "== $(date '+%F %T') sweep keep failed (exit $kept): stopping"
        exit "$kept"
    fi
}

run "$spec" "$@"
previous=""
while :; do
    rm -rf "${next:?}"/*
    sweep next "$spec" --results "$results" --out "$next" || exit $?
    written=$(find "$next" -name '*.yaml' | sort)
    if [ -z "$written" ]; then
        echo "== $(date '+%F %T') every ladder of $spec is bracketed with its seeds, or waits on a trial that did not finish (sweep next $spec --results $results)"
        break
    fi
    now=$(cat $written | grep -v '^#' | md5sum)
    if [ "$now" = "$previous" ]; then
        echo "== sweep next wrote the same trials again: they did not finish (sweep status $results/$name)"
        exit 1
    fi
    previous=$now
    for s in $written; do
        run "$s" "$@"
    done
done
