"""`tiered policies get|set|list|delete`: namespace and topic offload policies."""

from __future__ import annotations

import argparse
import re
from typing import Any

from tieredcore.errors import ValidationError
from tieredcore.lifecycle.policies import DRIVERS
from tieredcore.lifecycle.sweep import policy_store
from tieredcore.topic.reader import READ_PRIORITIES
from tieredcore.topics import NamespaceName, TopicName
from tieredcore.workspace import Workspace

_DURATION = re.compile(r"^(-1|\d+)(ms|s|m|h|d)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1}
_SIZE = re.compile(r"^(-1|\d+)([KMG])?$", re.I)
_UNIT_B = {None: 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def duration_ms(text: str) -> int:
    """'4h', '90m', '3600s', '500ms', plain ms, or -1 (disabled)."""
    m = _DURATION.match(text.strip())
    if not m:
        raise ValidationError(f"duration {text!r}: expected e.g. 4h, 90m, 3600s, 500ms or -1")
    n = int(m[1])
    return -1 if n < 0 else n * _UNIT_MS[m[2]]


def size_bytes(text: str) -> int:
    m = _SIZE.match(text.strip())
    if not m:
        raise ValidationError(f"size {text!r}: expected bytes like 1048576, 512K, 64M, 1G or -1")
    n = int(m[1])
    return -1 if n < 0 else n * _UNIT_B[(m[2] or "").upper() or None]


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
    s.add_argument("--offload-threshold-bytes", type=size_bytes, help="e.g. 1G; 0 = every sealed ledger; -1 off")
    s.add_argument("--offload-threshold-seconds", type=int, help="-1 off")
    s.add_argument("--deletion-lag", type=duration_ms, help="e.g. 4h; -1 keeps hot copies")
    s.add_argument("--retention-time-minutes", type=int, help="-1 unlimited")
    s.add_argument("--retention-size-mb", type=int, help="-1 unlimited")
    s.add_argument("--read-priority", choices=READ_PRIORITIES)
    s.add_argument("--max-block-size", type=size_bytes)
    s.add_argument("--read-buffer-size", type=size_bytes)
    s.add_argument("--store-driver", choices=DRIVERS, help="offload to this store instead of the workspace's")
    s.add_argument("--store-bucket")
    s.add_argument("--store-root")
    s.add_argument("--store-prefix", default="")
    s.add_argument("--store-endpoint", default="")
    s.add_argument("--store-region", default="")
    s.add_argument("--default-store", action="store_true", help="drop a store override")


def _updates(a: argparse.Namespace) -> dict[str, Any]:
    u: dict[str, Any] = {}
    for cli, key in (("offload_threshold_bytes", "offload_threshold_bytes"),
                     ("offload_threshold_seconds", "offload_threshold_seconds"),
                     ("deletion_lag", "deletion_lag_ms"), ("retention_time_minutes", "retention_time_minutes"),
                     ("retention_size_mb", "retention_size_mb"), ("read_priority", "read_priority"),
                     ("max_block_size", "max_block_size"), ("read_buffer_size", "read_buffer_size")):
        v = getattr(a, cli)
        if v is not None:
            u[key] = v
    if a.store_driver:
        u["store"] = {"driver": a.store_driver, "bucket": a.store_bucket or "", "root": a.store_root or "",
                      "prefix": a.store_prefix, "endpoint": a.store_endpoint, "region": a.store_region}
    elif a.default_store:
        u["store"] = None
    if not u and not a.replace:
        raise ValidationError("policies set: no field given (see `tiered policies set --help`)")
    return u


def run(a: argparse.Namespace, ws: Workspace) -> dict[str, Any]:
    ps = policy_store(ws)  # the workspace configuration is the cluster default
    cmd = a.policies_cmd
    if cmd == "list":
        rows = []
        for ns in sorted(set(ws.ml.list_policy_namespaces()) | set(ws.ml.list_namespaces())):
            eff = ps.for_namespace(ns)
            rows.append({"namespace": ns, "overrides": ps.namespace_overrides(ns),
                         "offload_enabled": eff.offload_enabled,
                         "topic_overrides": [t.full for t in ws.ml.list_topic_policy_topics(ns)]})
        return {"namespaces": rows}
    if a.topic:
        t = TopicName.parse(a.target)
        if cmd == "get":
            return {"topic": t.full, "overrides": ps.topic_overrides(t), "effective": ps.for_topic(t).to_json()}
        if cmd == "delete":
            return {"topic": t.full, "deleted": ws.ml.delete_topic_policies(t)}
        eff = ps.set_topic(t, _updates(a), replace_all=a.replace)
        return {"topic": t.full, "overrides": ps.topic_overrides(t), "effective": eff.to_json()}
    ns = NamespaceName.parse(a.target).name
    if cmd == "get":
        return {"namespace": ns, "overrides": ps.namespace_overrides(ns), "effective": ps.for_namespace(ns).to_json()}
    if cmd == "delete":
        return {"namespace": ns, "deleted": ws.ml.delete_policies(ns)}
    eff = ps.set_namespace(ns, _updates(a), replace_all=a.replace)
    return {"namespace": ns, "overrides": ps.namespace_overrides(ns), "effective": eff.to_json()}
