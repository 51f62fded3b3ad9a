"""`tiered init`: a workspace with embedded defaults, its metadata store's identity and its store claimed."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tieredcore.attach import attached_config, check_attach
from tieredcore.cli.common import (
    sqlite_path,
)
from tieredcore.config import CONFIG_FILE_NAME, Config
from tieredcore.errors import ValidationError
from tieredcore.names import check_cluster_name
from tieredcore.workspace import Workspace


def _missing_dirs(path: Path, what: str) -> list[Path]:
    """The directories mkdir(parents=True) would create for `path`, outermost first; refuses (nothing
    created yet) when an existing component is not a directory or the first one cannot be written."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        if p.is_symlink():  # a dangling link: mkdir would fail on it anyway
            raise ValidationError(f"cannot create {what} {path}: {p} is a dangling symbolic link")
        missing.append(p)
        p = p.parent
    if not p.is_dir():
        raise ValidationError(f"cannot create {what} {path}: {p} exists and is not a directory")
    if missing and not os.access(p, os.W_OK | os.X_OK):
        raise ValidationError(f"cannot create {what} {path}: directory {p} is not writable")
    return missing[::-1]


def _make_dirs(dirs: list[tuple[Path, str]]) -> None:
    """Creates every directory or none: a failure (e.g. under /proc, where even root's access() check
    passes) removes the directories made so far, all still empty."""
    plans = [(path, what, _missing_dirs(path, what)) for path, what in dirs]  # check all before creating
    made: list[Path] = []
    for path, what, missing in plans:
        for d in missing:
            if d.is_dir():  # shared with an earlier directory of the list
                continue
            try:
                d.mkdir()
            except OSError as e:
                for m in reversed(made):
                    with contextlib.suppress(OSError):
                        m.rmdir()
                raise ValidationError(f"cannot create {what} {path}: {e.strerror or e} ({d})") from None
            made.append(d)


def add_parser(sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("init", parents=parents, help="create a workspace with embedded defaults")
    s.add_argument("dir", nargs="?", help="workspace directory (default ./workspace)")
    s.add_argument("--store-url", help="object store URL instead of the embedded filesystem store (s3://, azure://, gs://; "
                                          "credentials from the environment)")
    s.add_argument("--metadata-url", help="metadata store URL instead of the embedded SQLite file, e.g. "
                                          "zk://127.0.0.1:2181/tiered-storage (ZooKeeper, Pulsar's layout)")
    s.add_argument("--cluster", help="cluster name written on every object (default standalone); workspaces "
                                     "sharing a store need different names. With --pulsar-zk: the Pulsar cluster "
                                     "(default: the one registered in its ZooKeeper)")
    s.add_argument("--pulsar-zk", metavar="zk://HOST:PORT[/chroot]",
                   help="attach to a running Pulsar cluster (docs/pulsar.md): its ZooKeeper (Pulsar's metadataStoreUrl) "
                        "is read, never written; needs --store-url, the cluster's bucket; no hot tier (BookKeeper is "
                        "Pulsar's)")
    s.add_argument("--brokers-default", action="store_true",
                   help="with --pulsar-zk: the --store-url bucket is the brokers' default offload bucket (broker.conf), "
                        "which namespace policies need not name")
    s.add_argument("--replica-of", metavar="STORE_URL",
                   help="a read replica (docs/recovery.md): follows the topic manifests another cluster writes in "
                        "this bucket (s3://bucket/prefix?endpoint=..., file:///dir), serves reads, never writes there; "
                        "its records live in its own SQLite file. --cluster: whose manifests (default: the only "
                        "cluster with manifests there)")
    s.add_argument("--force", action="store_true", help="rewrite an existing configuration")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.dir and args.workspace and Path(args.dir).resolve() != Path(args.workspace).resolve():
        raise ValidationError(f"init names two workspaces: DIR {args.dir} and --workspace {args.workspace}; give one")
    if args.cluster is not None:
        check_cluster_name(args.cluster, "--cluster")
    root = Path(args.dir or args.workspace or "workspace").resolve()
    cfg_path = root / CONFIG_FILE_NAME
    if root.exists() and not root.is_dir():
        raise ValidationError(f"{root} exists and is not a directory")
    created = not cfg_path.exists() or args.force
    if args.replica_of or (not created and Config.load(cfg_path, env={}).replica):
        return _run_replica(args, root, cfg_path, created)
    if args.pulsar_zk or args.brokers_default or (not created and Config.load(cfg_path, env={}).attached):
        return _run_attached(args, root, cfg_path, created)
    if created:
        overrides: dict[str, Any] = {"store_url": args.store_url} if args.store_url else {}
        if args.cluster is not None:  # an empty name is refused, not read as "the default"
            overrides["cluster"] = args.cluster
        if args.metadata_url:
            overrides["metadata_url"] = args.metadata_url
        cfg = Config.for_workspace(root, **overrides)
    else:
        cfg = Config.load(cfg_path, env={})
    dirs = [(root, "workspace directory")]
    for url, what in ((cfg.hot_url, "hot tier directory"), (cfg.store_url, "object store directory")):
        u = urlparse(url)
        if u.scheme == "file":  # URLs are percent-encoded (a workspace path may hold ' ', '%', '#')
            dirs.append((Path(unquote(u.path)), what))
    if cfg.reports_dir:
        dirs.append((Path(cfg.reports_dir), "reports directory"))
    db = sqlite_path(cfg)
    if db is not None:
        dirs.append((db.parent, "metadata store directory"))
    if created and root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise ValidationError(f"cannot write {cfg_path}: directory {root} is not writable")
    # a store whose owner marker names this cluster with another metadata store is refused before
    # anything is written (tieredcore.offload.ownership); a filesystem store not created yet has no marker
    if not _new_local_store(cfg):
        _check_store_unclaimed(cfg)
    _make_dirs(dirs)
    if created:
        cfg_path.write_text(cfg.to_toml())
    with Workspace(cfg) as ws:
        ws.claim(ws.store, ws.offloader.prefix)  # creates the database and its identity, claims the store
        identity = ws.identity
    return {"workspace": str(root), "config": str(cfg_path), "created": created, "cluster": cfg.cluster,
            "identity": identity, "metadata": cfg.metadata_url, "hot": cfg.hot_url, "store": cfg.store_url}


def _run_attached(args: argparse.Namespace, root: Path, cfg_path: Path, created: bool) -> dict[str, Any]:
    """`tiered init --pulsar-zk`: every check reads only (tieredcore.attach); then the workspace directory,
    its configuration and the project's identity under its own ZooKeeper root. Nothing in the bucket."""
    if created:
        if not args.pulsar_zk:
            raise ValidationError("--brokers-default goes with --pulsar-zk")
        if args.metadata_url:
            raise ValidationError("--pulsar-zk names the metadata store (the cluster's ZooKeeper): no --metadata-url")
        cfg = attached_config(root, args.pulsar_zk, args.store_url or "", args.cluster)
    else:
        cfg = Config.load(cfg_path, env={})
    cfg, found = check_attach(cfg, cluster_given=bool(args.cluster) or not created,
                              brokers_default=args.brokers_default)
    if created and root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise ValidationError(f"cannot write {cfg_path}: directory {root} is not writable")
    _make_dirs([(root, "workspace directory"), (Path(cfg.reports_dir), "reports directory")])
    if created:
        cfg_path.write_text(cfg.to_toml())
    with Workspace(cfg) as ws:
        identity = ws.identity  # under the project's own root, never under Pulsar's paths
    bucket = (f"named by the offload policies of {', '.join(found.named_by)}" if found.named_by
              else "the brokers' default (as stated)")
    return {"workspace": str(root), "config": str(cfg_path), "created": created, "attached": True,
            "cluster": cfg.cluster, "identity": identity, "metadata": cfg.metadata_url, "hot": cfg.hot_url,
            "store": cfg.store_url, "bucket": bucket, "namespaces": len(found.namespaces)}


def _run_replica(args: argparse.Namespace, root: Path, cfg_path: Path, created: bool) -> dict[str, Any]:
    """`tiered init DIR --replica-of STORE_URL`: reads only in the bucket (which clusters wrote manifests there),
    then the workspace directory, its configuration and its empty SQLite metadata store. Nothing in the bucket."""
    from tieredcore.lifecycle.replica import manifest_clusters

    if created:
        for flag, given in (("--pulsar-zk", args.pulsar_zk), ("--store-url", args.store_url),
                            ("--metadata-url", args.metadata_url), ("--brokers-default", args.brokers_default)):
            if given:
                raise ValidationError(f"--replica-of names the bucket and keeps its records in the workspace's own "
                                      f"SQLite file: no {flag}")
        cfg = Config.for_workspace(root, store_url=args.replica_of, replica_of=args.replica_of,
                                   **({"cluster": args.cluster} if args.cluster is not None else {}))
    else:
        cfg = Config.load(cfg_path, env={})
        if not cfg.replica or (args.replica_of and args.replica_of != cfg.replica_of):
            raise ValidationError(f"{cfg_path} exists and is not a read replica of {args.replica_of or '?'}: "
                                  "give another directory, or --force to rewrite its configuration")
    with Workspace(cfg) as ws:
        loc = cfg.store_location
        clusters = manifest_clusters(ws.open_location(loc), loc.prefix)
    where = f"{cfg.replica_of} (prefix {loc.prefix!r})"
    if not clusters:
        raise ValidationError(f"no topic manifests under {where}: nothing a replica could follow")
    if created and args.cluster is None:
        if len(clusters) > 1:
            raise ValidationError(f"{where} holds topic manifests of {len(clusters)} clusters: "
                                  f"{', '.join(clusters)}; choose one with --cluster NAME")
        cfg = Config.for_workspace(root, store_url=args.replica_of, replica_of=args.replica_of, cluster=clusters[0])
    elif cfg.cluster not in clusters:
        raise ValidationError(f"no topic manifests of cluster {cfg.cluster!r} under {where}; clusters with "
                              f"manifests: {', '.join(clusters)}")
    if created and root.is_dir() and not os.access(root, os.W_OK | os.X_OK):
        raise ValidationError(f"cannot write {cfg_path}: directory {root} is not writable")
    dirs = [(root, "workspace directory"), (Path(cfg.reports_dir), "reports directory")]  # no hot tier
    db = sqlite_path(cfg)
    if db is not None:
        dirs.append((db.parent, "metadata store directory"))
    _make_dirs(dirs)
    if created:
        cfg_path.write_text(cfg.to_toml())
    cfg.open_metadata().close()  # the replica's own (empty) store: `tiered replica-sync` fills it
    return {"workspace": str(root), "config": str(cfg_path), "created": created, "replica_of": cfg.replica_of,
            "cluster": cfg.cluster, "metadata": cfg.metadata_url, "store": cfg.store_url,
            "next": f"tiered --workspace {root} replica-sync"}


def _new_local_store(cfg: Config) -> bool:
    """A filesystem store whose directory does not exist yet (opening it would create it)."""
    u = urlparse(cfg.store_url)
    return u.scheme == "file" and not Path(unquote(u.path)).exists()


def _check_store_unclaimed(cfg: Config) -> None:
    """StoreOwnershipError when the store's marker for this cluster names another metadata store (an
    existing metadata store is read for its identity, a missing one is not created)."""
    from tieredcore.formats.keys import normalize_prefix
    from tieredcore.offload.ownership import StoreOwnershipError, read_identity, read_marker

    store, prefix = cfg.open_store()
    marker = read_marker(store, normalize_prefix(prefix), cfg.cluster)
    if marker is None:
        return
    u = urlparse(cfg.metadata_url)
    mine = None
    if u.scheme != "sqlite" or Path(unquote(u.path)).exists():
        meta = cfg.open_metadata()
        try:
            mine = read_identity(meta)
        finally:
            meta.close()
    if mine != marker.identity:
        raise StoreOwnershipError(
            f"{cfg.store_url} is already used by cluster {cfg.cluster!r} of another workspace (metadata store "
            f"{marker.metadata}, identity {marker.identity}). Two workspaces with the same cluster name must not "
            "share a store prefix: give this one another cluster name (--cluster NAME) or another store prefix.")
