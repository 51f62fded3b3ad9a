#!/usr/bin/env bash
# The main job on embedded defaults: SQLite metadata, a local hot tier, a filesystem object store,
# Spark local[2], Airflow on SQLite. Generates a workload of Pulsar messages (batched or not, each
# compression codec) in five namespaces with different policies (one in PIP-76 streaming mode, whose
# topics' open ledgers hold entries), shows the messages of two topics, runs the offload-sweep DAG and then
# the deletion-lag-cleanup DAG with `airflow dags test` (their task logs: $WS/sweep.log, $WS/cleanup.log; the
# end says how to see task logs in the UI), prints the tiers before and after, reads the
# streaming namespace back from the object store alone, and every entry through the cross-tier reader; a
# deep scrub checks every copy and every message's own CRC32C (message-level counts per namespace).
# Then a compaction (docs/compaction.md) of a namespace of small ledgers: its objects before and after, the
# old ones deleted once the delete delay has passed, every entry read back. Then a topic compaction
# (docs/topic-compaction.md): a keyed topic compacted, more messages produced, compacted again. Then chunked objects: a
# compressed and an encrypted namespace of text, stored bytes vs logical bytes, read back. Then three Spark SQL
# queries over acme/audit through the tiered data source (scripts/demo_queries.py). Last, disaster recovery:
# a copy of the bucket, a fresh workspace recovered from it alone (`tiered recover --apply`), every topic
# with offloaded entries verified from the copy (the demo fails if one is not recovered).
set -euo pipefail
cd "$(dirname "$0")/.."
WS=$(realpath -m "${1:-workspace}")
. scripts/airflow-env.sh "$WS"
started=$SECONDS
step() { printf '\n== %s\n' "$*"; }

# logical dates: the newest sealed ledger closed 15 minutes before the sweep; lag cleanup 5 hours later
SWEEP_AT=$(date -u -d "@$(( $(date -u +%s) / 900 * 900 ))" +%Y-%m-%dT%H:%M:%S+00:00)
GEN_END=$(date -u -d "$SWEEP_AT - 15 minutes" +%Y-%m-%dT%H:%M:%S+00:00)
CLEANUP_AT=$(date -u -d "$SWEEP_AT + 5 hours" +%Y-%m-%dT%H:%M:%S+00:00)

step "workspace $WS"
rm -rf "$WS"
tiered init "$WS" >/dev/null
gen() { tiered generate --end-time "$GEN_END" --ledger-interval 300 --ledgers 20 --topics 3 "$@" >/dev/null; }
# every entry is a Pulsar message or a batch of them (docs/formats.md "Messages inside entries"), each
# namespace's producers with their own settings: batches of 1-10 (the default) or no batching, each codec
gen --namespace public/default --entries 400 --entry-size 64-4096 --payload text --compression LZ4
gen --namespace acme/payments --entries 300 --entry-size 512-8192 --payload text --compression ZSTD \
    --broker-entry-metadata
gen --namespace acme/audit --entries 2000 --entry-size 16-256 --batch 0 --keys 20
gen --namespace sandbox/dev --entries 200 --entry-size 1K-16K --compression mix --batch 1-50
# streaming: the open ledgers hold entries too (written 15 minutes before the sweep)
gen --namespace public/streaming --ledgers 10 --entries 200 --entry-size 64-2048 --open-entries 300 \
    --payload text --compression SNAPPY

step "the messages inside a topic's entries (tiered read --messages; --json for every field)"
tiered read acme/payments/topic-0000 --messages --limit 4 | cut -c1-160
tiered read sandbox/dev/topic-0001 --messages --limit 3 | cut -c1-160

step "namespace policies"
tiered policies set public/default --offload-threshold-bytes 0 --deletion-lag 1h >/dev/null
tiered policies set acme/payments --offload-threshold-bytes 8M --deletion-lag 8h >/dev/null
tiered policies set acme/audit --offload-threshold-seconds 3600 --deletion-lag 2h --retention-time-minutes 10080 >/dev/null
# PIP-76: every entry, the open ledgers' included, in segments of at most 1 MiB (64 KiB blocks); a smaller
# last segment is closed 10 minutes after its oldest entry was written
tiered policies set public/streaming --offload-mode streaming --max-segment-size 1M --streaming-block-size 64K \
    --max-segment-rollover 10m --deletion-lag 1h >/dev/null
tiered policies list

step "before"
tiered status --by-namespace

step "airflow: tiered_offload_sweep at $SWEEP_AT"
scripts/airflow-init.sh  # database, the `spark` pool, spark_default and aws_default (Admin -> Connections)
airflow dags test tiered_offload_sweep "$SWEEP_AT" > "$WS/sweep.log" 2>&1 || { tail -40 "$WS/sweep.log"; exit 1; }
grep -h "TIERED_RUN_SUMMARY" "$WS/sweep.log" | sed 's/.*TIERED_RUN_SUMMARY /  /' | cut -c1-220
grep -h "offload_sweep summary:" "$WS/sweep.log" | sed 's/.*offload_sweep summary:/  summary:/' | cut -c1-400

step "after the sweep"
tiered status --by-namespace

step "streaming namespace public/streaming: its segments, and every entry read back from the object store alone"
tiered status --namespace public/streaming
tiered verify --offloaded-only --namespace public/streaming
# the open ledgers' entries included: nothing of the namespace may be left in the hot tier only
tiered --json verify --offloaded-only --namespace public/streaming | python -c '
import json, sys
r = json.load(sys.stdin)
failed, hot_only, n = r["failed"], r["hot_only_entries"], r["entries"]
if failed or hot_only or not n:
    sys.exit("streaming: %d topic(s) failed, %d entries in the hot tier only" % (failed, hot_only))
print("streaming: all %d entries of public/streaming, the open ledgers included, read from the object store" % n)'

step "airflow: tiered_deletion_lag_cleanup at $CLEANUP_AT"
airflow dags test tiered_deletion_lag_cleanup "$CLEANUP_AT" > "$WS/cleanup.log" 2>&1 || { tail -40 "$WS/cleanup.log"; exit 1; }
grep -h "TIERED_RUN_SUMMARY" "$WS/cleanup.log" | sed 's/.*TIERED_RUN_SUMMARY /  /' | cut -c1-220

step "after the deletion-lag cleanup"
tiered status --by-namespace

step "verify: every entry, from wherever it lives, against the generator's digest"
tiered verify

step "scrub: every offloaded copy read back against its checksums, the hot copies' CRCs and each Pulsar message's own CRC32C"
# --messages all: the messages are checked in this project's objects too (by default only in objects without
# chunk checksums, i.e. Pulsar-written ones); counts are entries (a batch is one entry, one CRC32C)
tiered --json scrub --deep --messages all | python -c '
import json, sys
r = json.load(sys.stdin)
cols = ("messages_checked", "messages_unchecked", "messages_damaged", "not_messages")
print("  %-18s %8s %6s %15s %10s %9s %9s" % ("namespace", "ledgers", "ok", "bytes read", "messages", "damaged",
                                             "not msgs"))
for ns, d in sorted(r["namespaces"].items()):
    c = d.get("counters") or dict.fromkeys(cols, 0)
    print("  %-18s %8d %6d %15s %10s %9d %9d" % (ns, d["ledgers"], d["outcomes"].get("ok", 0), format(d["bytes"], ","),
                                                 format(c["messages_checked"], ","), c["messages_damaged"],
                                                 c["not_messages"]))
m = r["messages"]
print("  all: %s entries of messages checked (CRC32C), %d without a checksum, %d damaged, %d not messages; "
      "%d problem(s)" % (format(m.get("messages_checked", 0), ","), m.get("messages_unchecked", 0),
                         m.get("messages_damaged", 0), m.get("not_messages", 0), len(r["problems"])))
if r["problems"] or not m.get("messages_checked") or m.get("messages_damaged"):
    sys.exit("scrub: damage found (or no message checked): %s" % r["problems"][:3])'

# the namespace's objects (data + index per ledger or segment) and the whole object store's
objects() {
    tiered --json status --by-namespace | python -c '
import json, sys
r = json.load(sys.stdin)
print("  %s: %d objects hold its data; the object store holds %d objects" % (
    sys.argv[1], r["namespaces"][sys.argv[1]]["objects"], r["store"]["objects"]))' "$1"
}
SMALL=iot/sensors
step "compaction: $SMALL, a namespace of small ledgers (a few KiB every 5 minutes), offloaded one object pair per ledger"
gen --namespace $SMALL --topics 2 --ledgers 30 --entries 40 --entry-size 32-256
TIERED_NO_PROGRESS=1 tiered offload --namespace $SMALL --keep-bytes 0
objects $SMALL
# a dry run looks at any topic: what would enabling compaction save?
tiered compact --dry-run --namespace $SMALL
tiered policies set $SMALL --compaction on --compaction-min-object-size 8M --compaction-target-size 256M \
    --compaction-delete-delay 1h >/dev/null
tiered compact --namespace $SMALL
tiered status --namespace $SMALL
objects $SMALL
# readers that opened an old object before the switch have the delete delay to finish; after it the
# drain deletes the old objects (the drain's in-use check keeps anything referenced again)
tiered deletions drain --as-of "$(date -u -d '+2 hours' +%Y-%m-%dT%H:%M:%S+00:00)"
objects $SMALL
tiered verify --offloaded-only --namespace $SMALL
tiered verify --namespace $SMALL

# topic compaction (docs/topic-compaction.md), not the object repacking above: the latest value per key
TABLE=acme/table
TT=$TABLE/topic-0000
step "topic compaction: $TT, 1000 entries of batched messages over 50 keys; its compacted view keeps one per key"
gen --namespace $TABLE --topics 1 --ledgers 5 --entries 200 --entry-size 64-512 --keys 50 --payload text
tiered compact-topic $TT
tiered read $TT --compacted --messages --limit 4 | cut -c1-150
# a producer sends more: new values of key-0..key-2, an empty payload for key-3 (a tombstone: the key goes),
# a new key; the second compaction reads the compacted ledger plus what followed its horizon (incremental)
python - "$TT" <<'PY'
import sys
from tieredcore.clock import now_ms
from tieredcore.config import Config
from tieredcore.formats.messages import OutMessage, encode_message
from tieredcore.topic.writer import TopicWriter
from tieredcore.workspace import Workspace

with Workspace(Config.load()) as ws:
    msgs = [OutMessage(payload=b"updated value %d" % i, key=f"key-{i}") for i in range(3)]
    msgs += [OutMessage(payload=b"", key="key-3"), OutMessage(payload=b"a new key", key="new-key")]
    w = TopicWriter(ws.ml, ws.hot, sys.argv[1])
    w.append_many([encode_message(m, producer="demo", sequence_id=10**9 + i, publish_time=now_ms())
                   for i, m in enumerate(msgs)])
    w.close()
print(f"  produced {len(msgs)} messages to {sys.argv[1]}")
PY
tiered compact-topic $TT
tiered read $TT --compacted --messages --limit 4 | cut -c1-150
echo "  the keys the producer changed, in the compacted view:"
tiered read $TT --compacted --messages | grep -E 'key="(key-[0-3]|new-key)"' | cut -c1-150

# chunked objects (docs/formats.md "Chunked objects"): a compressed and a compressed + encrypted namespace of
# log-like (compressible) text; the encrypted one's data keys wrapped by the key ring's active key
LOGS=acme/logs VAULT=acme/vault
step "transforms: $LOGS compressed (zstd), $VAULT compressed and encrypted (zstd+aes, key ring $WS/keys)"
sed -i "s|^key_ring = .*|key_ring = \"$WS/keys\"|" "$WS/tiered.toml"
tiered keys new demo-1 | grep -E '^(key_ring|created|active):' | sed 's/^/  /'
gen --namespace $LOGS --namespace $VAULT --topics 2 --ledgers 4 --entries 200 --entry-size 1K-8K --payload text
tiered policies set $LOGS --transform zstd --transform-chunk-size 1M >/dev/null
tiered policies set $VAULT --transform zstd+aes --transform-chunk-size 1M >/dev/null
TIERED_NO_PROGRESS=1 tiered offload --namespace $LOGS --keep-bytes 0
TIERED_NO_PROGRESS=1 tiered offload --namespace $VAULT --keep-bytes 0
# stored bytes (chunks + manifests) vs logical bytes (the Pulsar-format objects they hold), from the manifests
tiered --json status --cache | python -c '
import json, sys
c = json.load(sys.stdin)["cache"]
for ns in sys.argv[1:]:
    a = c["namespaces"][ns]
    print("  %s: %d objects, %.1f MiB logical, %.1f MiB stored (%.0f%%): %d compressed, %d encrypted" % (
        ns, a["objects"], a["logical_bytes"] / 2**20, a["stored_bytes"] / 2**20,
        100 * a["stored_bytes"] / a["logical_bytes"], a["compressed"], a["encrypted"]))' $LOGS $VAULT
tiered keys status
tiered verify --offloaded-only --namespace $LOGS
tiered verify --offloaded-only --namespace $VAULT
# the archive as data (docs/query_examples.py has more): Spark SQL over acme/audit through format("tiered"),
# across tiers; a publish-time range that plans one ledger (its planned/pruned parts, GETs); latest per key
# and the Iceberg export (docs/export.md) of its offloaded ledgers, read back as a table
step "the Iceberg export of acme/audit (tiered export: one table per topic, partitioned by day)"
tiered export --namespace acme/audit --as-of "$CLEANUP_AT"
step "queries: Spark SQL over acme/audit through the tiered data source and its Iceberg table (scripts/demo_queries.py)"
python scripts/demo_queries.py "$WS" --namespace acme/audit --iceberg
# disaster recovery (docs/recovery.md): the metadata store is lost, the bucket alone is left. A copy of the
# bucket, a fresh workspace pointing at it (its hot tier empty: every recovered ledger is cold-only), the
# records rebuilt from the topic manifests (else the index objects), and every entry read back from the copy
step "recovery: a fresh workspace rebuilt from a copy of the bucket alone (tiered recover)"
REC="$WS/recovered" BUCKET="$WS/recovered-bucket"
rm -rf "$REC" "$BUCKET"
cp -a "$WS/cold" "$BUCKET"
# `tiered init --store-url` refuses a bucket another workspace's owner marker claims: the fresh workspace is
# made on its own store, then pointed at the copy (what an operator does whose metadata store is gone)
tiered init "$REC" >/dev/null
sed -i -e "s|^store_url = .*|store_url = \"file://$BUCKET\"|" -e "s|^key_ring = .*|key_ring = \"$WS/keys\"|" \
    "$REC/tiered.toml"
rm -rf "$REC/cold"
export TIERED_NO_PROGRESS=1
tiered --json verify --offloaded-only > "$WS/verify-before.json" || { echo "verify of the original failed"; exit 1; }
{ tiered --workspace "$REC" recover || true; } > "$WS/recover-dry.txt"
echo "  dry run: $(grep -c '^create ' "$WS/recover-dry.txt") line(s), one per topic it would create; then: $(tail -1 "$WS/recover-dry.txt" | cut -d';' -f1)"
tiered --workspace "$REC" --json recover --apply > "$WS/recover.json" || true  # exit 1: hot-only ledgers lost
tiered --workspace "$REC" --json verify --offloaded-only > "$WS/verify-recovered.json" || true
python - "$WS/verify-before.json" "$WS/recover.json" "$WS/verify-recovered.json" <<'PY'
import json, sys
before, rec, after = (json.load(open(p)) for p in sys.argv[1:])
want = {r["topic"]: r for r in before["topics"] if r.get("entries")}  # topics with entries in the bucket
got = {r["topic"]: r for r in after["topics"]}
problems = [f"{t}: not recovered" for t in want if t not in got]
problems += [f"{t}: {got[t].get('entries')} of {r['entries']} offloaded entries read back ({got[t].get('reason')})"
             for t, r in want.items() if t in got and (got[t]["ok"] is not True or got[t]["entries"] != r["entries"])]
problems += [f"not recoverable: {x}" for x in rec["not_recoverable"] + rec["unreadable"]]
lost = sum(len(t["lost"]) for t in rec["topics"])
if problems or after["failed"]:
    sys.exit("recovery FAILED:\n  " + "\n  ".join(problems or [f"{after['failed']} topic(s) failed to verify"]))
print(f"  recovered {len(rec['topics'])} topic(s) ({sum(t['source'] == 'manifest' for t in rec['topics'])} from "
      f"manifests, {sum(t['source'] == 'index' for t in rec['topics'])} from index objects; "
      f"{sum(len(t['cold_only']) for t in rec['topics'])} ledgers cold-only, {lost} hot-only ledger(s) not in the "
      f"bucket, {len(rec['orphans'])} orphan(s) reported); verified: {after['verified']} topic(s), "
      f"{after['entries']:,} entries read back from the bucket copy, byte-identical, 0 failed")
PY
printf '\ndone in %ss; reports under %s/reports\n' "$((SECONDS - started))" "$WS"
cat <<EOF

Task logs of the demo's two DAG runs: $WS/sweep.log and $WS/cleanup.log
(\`airflow dags test\` runs the tasks inside that command and prints their logs there: the UI lists these
runs, their states, XComs and "Run report" links, but its Logs tab stays empty for them).
To see task logs in the UI, have the scheduler run a DAG:
  1. . scripts/airflow-env.sh $WS && airflow standalone
  2. open http://127.0.0.1:8080 (user admin; password in $WS/airflow/simple_auth_manager_passwords.json.generated)
  3. Dags -> tiered_offload_sweep -> unpause it -> Trigger (the form's defaults)
  4. the new run -> a task (plan, offload...) -> Logs (the Level filter shows the job's ERROR lines as errors)
EOF
