#!/usr/bin/env bash
# `make test` (and CI through .ci/run): every test, in two lanes at once.
#
#   lane 1  everything but tests/compose: pytest-xdist, two workers, one test file per worker at a time
#   lane 2  tests/compose (the docker-compose stack: debootstrap, image builds, the stack up, a sweep) at
#           nice 10, so its builds take the CPU lane 1 leaves idle (its Airflow and Spark tests spend
#           much of their time waiting) instead of slowing lane 1's timing-sensitive tests
#
# Lane 2's output goes to a file (named at the start) and is printed after lane 1's. The exit code is the
# first failing lane's; a lane that collects no test fails (pytest's exit code 5). Arguments go to lane 1.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
COMMON=(-q -p no:cacheprovider)

log=$(mktemp -t tiered-compose-lane.XXXXXX)
echo "tests/compose runs beside the other tests (nice 10); its output: $log (printed at the end)"
nice -n 10 "$PY" -m pytest "${COMMON[@]}" --durations=10 tests/compose >"$log" 2>&1 &
lane=$!
# an interrupted run interrupts lane 2 too (SIGINT: its fixtures stop the private dockerd and clean up)
trap 'kill -INT "$lane" 2>/dev/null; wait "$lane"; exit 130' INT TERM

"$PY" -m pytest "${COMMON[@]}" -n 2 --dist loadfile --durations=30 --ignore=tests/compose "$@"
rc=$?
wait "$lane"
crc=$?
trap - INT TERM
echo
echo "==== tests/compose (lane 2, exit $crc) ===="
cat "$log"
rm -f "$log"
for r in "$rc" "$crc"; do
    if [ "$r" -eq 5 ]; then
        echo "a lane collected no tests: failing" >&2
        exit 1
    fi
done
if [ "$rc" -ne 0 ]; then exit "$rc"; fi
exit "$crc"
