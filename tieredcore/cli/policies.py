"""`tiered policies get|set|list|delete`: namespace and topic offload policies."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tieredcore.cli.common import CommandGroup
from tieredcore.errors import TieredError, ValidationError
from tieredcore.formats.transform import TRANSFORMS
from tieredcore.model import INT64_MAX, int64_or_none
from tieredcore.names import NamespaceName, TopicName
from tieredcore.policy import DRIVERS, OFFLOAD_MODES, READ_PRIORITIES, OffloadPolicy, PolicyStore, merge
from tieredcore.pulsar_policies import brokers_own_policies
from tieredcore.units import duration_ms, size_bytes
from tieredcore.workspace import Workspace

COMMANDS = ("policies",)
_STORE_FLAGS = ("--store-bucket", "--store-root", "--store-prefix", "--store-endpoint", "--store-region")


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("policies", parents=parents, help="namespace / topic offload policies")
    ps = p.add_subparsers(dest="policies_cmd", required=True)
    g = ps.add_parser("get", parents=parents, help="stored overrides and the effective policy")
    g.add_argument("target", help="tenant/namespace, or a topic with --topic")
    g.add_argument("--topic", action="store_true", help="target is a topic")
    ps.add_parser("list", parents=parents, help="namespaces with policies and whether offload is enabled")
    d = ps.add_parser("delete", parents=parents, help="remove stored overrides")
    d.add_argument("target")
    d.add_argument("--topic", action="store_true")
    s = ps.add_parser("set", parents=parents, help="set fields (validated on the merged effective policy first)")
    s.add_argument("target")
    s.add_argument("--topic", action="store_true")
    s.add_argument("--replace", action="store_true", help="replace all stored overrides instead of merging")
    # values are parsed in _updates (not by argparse types) so a bad one is a one-line error naming its flag
    s.add_argument("--offload-threshold-bytes", help="e.g. 1G; 0 = every sealed ledger; -1 off")
    s.add_argument("--offload-threshold-seconds", help="-1 off")
    s.add_argument("--deletion-lag", help="e.g. 4h; -1 keeps hot copies")
    s.add_argument("--retention-time-minutes", help="-1 unlimited")
    s.add_argument("--retention-size-mb", help="-1 unlimited")
    s.add_argument("--read-priority", choices=READ_PRIORITIES)
    s.add_argument("--max-block-size", help="e.g. 64M")
    s.add_argument("--read-buffer-size", help="e.g. 1M")
    s.add_argument("--offload-mode", choices=OFFLOAD_MODES,
                   help="ledger: one object pair per sealed ledger; streaming: PIP-76 segments, open ledger included")
    s.add_argument("--max-segment-size", help="streaming: cut a segment at this size, e.g. 256M")
    s.add_argument("--max-segment-rollover", help="streaming: close a smaller segment this long after its oldest entry, e.g. 10m")
    s.add_argument("--streaming-block-size", help="streaming: blocks are padded to this size, e.g. 5M")
    s.add_argument("--compaction", choices=("on", "off"),
                   help="compaction of runs of small offloaded objects into segments (docs/compaction.md)")
    s.add_argument("--compaction-min-object-size", help="compaction: objects below this are small, e.g. 8M")
    s.add_argument("--compaction-target-size", help="compaction: new segments of up to this, e.g. 256M")
    s.add_argument("--compaction-delete-delay",
                   help="compaction: old objects are deleted this long after the switch (readers finish), e.g. 1h")
    s.add_argument("--compaction-threshold",
                   help="topic compaction (docs/topic-compaction.md; Pulsar's compaction-threshold): compact a "
                        "topic automatically once its backlog after the compaction horizon reaches this, e.g. "
                        "100M; 0 = any backlog; -1 off (the default)")
    s.add_argument("--transform", choices=TRANSFORMS,
                   help="chunked objects (docs/formats.md \"Chunked objects\"): zstd compresses each chunk, aes "
                        "encrypts it (AES-256-GCM, data keys wrapped by the key ring's active key); new objects only")
    s.add_argument("--transform-chunk-size", help="logical bytes per chunk, 4K..64M (default 4M): a random read "
                                                  "fetches at least one chunk")
    s.add_argument("--compression-level", help="zstd level 1..22 (default 3)")
    s.add_argument("--key-ring", help="directory of the key-encryption keys for aes (absolute; default: the "
                                      "configuration's key_ring); '' drops the override")
    s.add_argument("--store-driver", choices=DRIVERS, help="offload to this store instead of the workspace's")
    for flag in _STORE_FLAGS:
        s.add_argument(flag, help="with --store-driver")
    s.add_argument("--default-store", action="store_true", help="drop a store override")


def _count(text: str) -> int:
    """A plain integer >= -1 (-1: off / unlimited) within 64 bits."""
    t = text.strip()
    n = -1 if t == "-1" else int64_or_none(t) if t.isascii() and t.isdigit() else None
    if n is None:
        raise ValidationError(f"{text!r}: expected an integer between -1 and {INT64_MAX}")
    return n


def _on_off(text: str) -> bool:
    return text == "on"  # argparse choices: on | off


def _updates(a: argparse.Namespace) -> dict[str, Any]:
    u: dict[str, Any] = {}
    for cli, key, parse in (("offload_threshold_bytes", "offload_threshold_bytes", size_bytes),
                            ("offload_threshold_seconds", "offload_threshold_seconds", _count),
                            ("deletion_lag", "deletion_lag_ms", duration_ms),
                            ("retention_time_minutes", "retention_time_minutes", _count),
                            ("retention_size_mb", "retention_size_mb", _count),
                            ("read_priority", "read_priority", str),
                            ("max_block_size", "max_block_size", size_bytes),
                            ("read_buffer_size", "read_buffer_size", size_bytes),
                            ("offload_mode", "offload_mode", str),
                            ("max_segment_size", "max_segment_size", size_bytes),
                            ("max_segment_rollover", "max_segment_rollover_ms", duration_ms),
                            ("streaming_block_size", "streaming_block_size", size_bytes),
                            ("compaction", "compaction_enabled", _on_off),
                            ("compaction_min_object_size", "compaction_min_object_size", size_bytes),
                            ("compaction_target_size", "compaction_target_size", size_bytes),
                            ("compaction_delete_delay", "compaction_delete_delay_ms", duration_ms),
                            ("compaction_threshold", "topic_compaction_threshold_bytes", size_bytes),
                            ("transform", "transform", str),
                            ("transform_chunk_size", "transform_chunk_size", size_bytes),
                            ("compression_level", "compression_level", _count),
                            ("key_ring", "key_ring", str)):
        v = getattr(a, cli)
        if v is not None:
            try:
                u[key] = parse(v)
            except ValidationError as e:
                raise ValidationError(f"--{cli.replace('_', '-')}: {e}") from None
    store_flags = [f for f in _STORE_FLAGS if getattr(a, f[2:].replace("-", "_")) is not None]
    if store_flags and not a.store_driver:
        # without a driver these were silently dropped: the store the operator named was never used
        verb = "needs" if len(store_flags) == 1 else "need"
        raise ValidationError(f"{', '.join(store_flags)} {verb} --store-driver ({' or '.join(DRIVERS)})")
    if a.store_driver and a.default_store:
        raise ValidationError("give --store-driver or --default-store, not both")
    if a.store_driver:
        u["store"] = {"driver": a.store_driver, "bucket": a.store_bucket or "", "root": a.store_root or "",
                      "prefix": a.store_prefix or "", "endpoint": a.store_endpoint or "",
                      "region": a.store_region or ""}
    elif a.default_store:
        u["store"] = None
    if not u and not a.replace:
        raise ValidationError("policies set: no field given (see `tiered policies set --help`)")
    return u


def _check_key_ring(ws: Workspace, ps: PolicyStore, a: argparse.Namespace, updates: dict[str, Any]) -> None:
    """A policy set that names a key ring, or turns encryption on, must leave a key ring that loads (a
    directory with an active key): otherwise every offload of the namespace would fail later. Checked on
    the policy as it would be stored, before anything is."""
    if "key_ring" not in updates and "transform" not in updates:
        return
    if a.topic:
        t = TopicName.parse(a.target)
        where, base, current = f"topic {t.full}", ps.for_namespace(t.namespace_name), ps.topic_overrides(t)
    else:
        ns = NamespaceName.parse(a.target).name
        where, base, current = f"namespace {ns}", ps.defaults, ps.namespace_overrides(ns)
    eff: OffloadPolicy = merge(base, updates if a.replace else {**current, **updates}, where)
    eff.validate(where, ps.default_store_is_s3, ps.default_key_ring)
    ring = eff.key_ring or ws.config.key_ring
    if not (eff.transform_spec.encryption or updates.get("key_ring")) or not ring:
        return
    try:
        ws.key_ring(ring)
    except TieredError as e:
        flag = "--key-ring" if updates.get("key_ring") else f"--transform {eff.transform}"
        raise ValidationError(f"{flag}: {where} would encrypt with key ring {ring}, which does not load: {e}") from None


def run(a: argparse.Namespace, ws: Workspace, progress: Any = None) -> dict[str, Any]:
    ps = ws.policies  # the workspace configuration is the cluster default
    cmd = a.policies_cmd
    if ws.attached and cmd in ("set", "delete"):  # Pulsar's brokers' policies: read, never written
        raise brokers_own_policies(ws.config.cluster, f"{cmd} the policies of {a.target}")
    if ws.attached and cmd == "get" and not a.topic:
        ns = NamespaceName.parse(a.target).name
        return {"namespace": ns, "pulsar": ws.pulsar.namespace_policies(ns), "overrides": ps.namespace_overrides(ns),
                "effective": ps.for_namespace(ns).to_json()}
    if cmd == "list":
        rows = []
        for ns in sorted(set(ws.ml.list_policy_namespaces()) | set(ws.ml.list_namespaces())):
            eff = ps.for_namespace(ns)
            rows.append({"namespace": ns, "overrides": ps.namespace_overrides(ns),
                         "offload_enabled": eff.offload_enabled, "compaction_enabled": eff.compaction_enabled,
                         "topic_compaction_threshold_bytes": eff.topic_compaction_threshold_bytes,
                         "transform": eff.transform,
                         "topic_overrides": [t.full for t in ws.ml.list_topic_policy_topics(ns)]})
        return {"namespaces": rows}
    if a.topic:
        t = TopicName.parse(a.target)
        if cmd == "get":
            return {"topic": t.full, "overrides": ps.topic_overrides(t), "effective": ps.for_topic(t).to_json()}
        if cmd == "delete":
            return {"topic": t.full, "deleted": ws.ml.delete_topic_policies(t)}
        updates = _updates(a)
        _check_key_ring(ws, ps, a, updates)
        eff = ps.set_topic(t, updates, replace_all=a.replace)
        return {"topic": t.full, "overrides": ps.topic_overrides(t), "effective": eff.to_json()}
    ns = NamespaceName.parse(a.target).name
    if cmd == "get":
        return {"namespace": ns, "overrides": ps.namespace_overrides(ns), "effective": ps.for_namespace(ns).to_json()}
    if cmd == "delete":
        return {"namespace": ns, "deleted": ws.ml.delete_policies(ns)}
    updates = _updates(a)
    _check_key_ring(ws, ps, a, updates)
    eff = ps.set_namespace(ns, updates, replace_all=a.replace)
    return {"namespace": ns, "overrides": ps.namespace_overrides(ns), "effective": eff.to_json()}


def size_text(n: int) -> str:
    """A size as `--compaction-threshold` takes it: the largest binary unit dividing it (100M, 1536K, 7)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def print_human(cmd: str, res: dict[str, Any]) -> None:
    if "namespaces" not in res:
        print(json.dumps(res, indent=2))
        return
    for r in res["namespaces"]:
        flags = "on " if r["offload_enabled"] else "off"
        compaction = "on " if r["compaction_enabled"] else "off"
        fields = ", ".join(f"{k}={v}" for k, v in sorted(r["overrides"].items())) or "(defaults)"
        more = f"; {len(r['topic_overrides'])} topic override(s)" if r["topic_overrides"] else ""
        th = r["topic_compaction_threshold_bytes"]
        topic_compaction = "off" if th < 0 else size_text(th)
        print(f"{r['namespace']:<28} offload {flags}  compaction {compaction}  topic compaction "
              f"{topic_compaction:<6}  transform {r['transform']:<8}  {fields}{more}")


GROUP = CommandGroup(COMMANDS, add_parser, run, print_human)
