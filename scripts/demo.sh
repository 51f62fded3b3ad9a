#!/usr/bin/env bash
# The main job on embedded defaults (SQLite metadata, local hot tier, filesystem object store):
# create a workspace, generate topics, offload, show the tier table, verify every entry.
set -euo pipefail
cd "$(dirname "$0")/.."
WS=${1:-workspace}
T=.venv/bin/tiered
rm -rf "$WS"
$T init "$WS"
$T --workspace "$WS" generate --namespace public/default --namespace acme/payments \
    --topics 3 --ledgers 8 --entries 2000 --entry-size 64-4096
echo "== before offload"
$T --workspace "$WS" status
$T --workspace "$WS" offload --namespace public/default --keep-bytes 0
$T --workspace "$WS" offload --namespace acme/payments --keep-bytes 20000000
echo "== after offload"
$T --workspace "$WS" status
$T --workspace "$WS" verify
