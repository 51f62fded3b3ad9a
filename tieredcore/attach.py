"""Attaching a workspace to a running Pulsar cluster (docs/pulsar.md): the configuration it gets and the
checks made before anything is created.

``tiered init DIR --pulsar-zk zk://HOST:PORT[/chroot] --store-url URL [--cluster NAME] [--brokers-default]``:

- the metadata store is the cluster's ZooKeeper, attached read-only (``zk://HOST:PORT/tiered-storage?
  chroot=/chroot&attached=true``): topic records and namespace policies are read where Pulsar keeps them,
  the project's own records (identity, deletion log, leases) live under ``<chroot>/tiered-storage``;
- the hot tier is ``bookkeeper:`` (Pulsar's BookKeeper: never read, never written);
- the store is the cluster's bucket (Pulsar writes keys without a prefix, so the URL names none).

Checks, each refusing with one line (:class:`AttachError`) and nothing created or written: ZooKeeper
answers and holds a Pulsar layout (``/managed-ledgers`` and ``/admin/clusters`` under the chroot); the
cluster is registered there (``--cluster``; without it, the one cluster registered); the bucket is one
the namespaces' offload policies name, or the operator states that it is the brokers' default
(``--brokers-default``: broker.conf's bucket, which ZooKeeper does not record).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import quote, urlparse

from tieredcore.cold.location import StoreLocation, parse_store_url
from tieredcore.config import Config
from tieredcore.errors import AttachError, FormatError, MetadataStoreError, ValidationError
from tieredcore.hot.bookkeeper import BOOKKEEPER_URL
from tieredcore.meta.managed_ledgers import ManagedLedgerStore
from tieredcore.meta.pulsar import PulsarRecords
from tieredcore.meta.store import validate_path
from tieredcore.meta.zookeeper import DEFAULT_ROOT, ZkLocation, ZkMetadataStore
from tieredcore.pulsar_policies import PulsarPolicyStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attachment:
    """What the checks found: the cluster, and which namespaces' policies name the bucket."""

    cluster: str
    namespaces: list[str]
    named_by: list[str] = field(default_factory=list)  # namespaces whose offload policies name the bucket
    brokers_default: bool = False  # the operator stated that the bucket is the brokers' default


def metadata_url(pulsar_zk: str, root: str = DEFAULT_ROOT) -> str:
    """The attached metadata URL of ``zk://HOST:PORT[,HOST:PORT...][/chroot]`` (also Pulsar's own
    ``zk:HOST:PORT/chroot`` spelling): the chroot is Pulsar's metadata root, ``root`` the project's node."""
    text = pulsar_zk.strip()
    if text.startswith("zk:") and not text.startswith("zk://"):
        text = "zk://" + text[3:]
    u = urlparse(text)
    if u.scheme != "zk" or u.query or u.fragment or not u.netloc:
        raise AttachError(f"--pulsar-zk {pulsar_zk!r}: expected zk://HOST:PORT[,HOST:PORT...][/chroot] (Pulsar's "
                          "metadataStoreUrl), no options")
    chroot = "" if u.path in ("", "/") else u.path
    if chroot:
        try:
            validate_path(chroot)
        except ValidationError as e:
            raise AttachError(f"--pulsar-zk {pulsar_zk!r}: bad chroot: {e}") from None
    query = (f"chroot={quote(chroot)}&" if chroot else "") + "attached=true"
    url = f"zk://{u.netloc}{root}?{query}"
    try:
        ZkLocation.parse(url)
    except ValidationError as e:
        raise AttachError(f"--pulsar-zk {pulsar_zk!r}: {e}") from None
    return url


def attached_config(root: str | Path, pulsar_zk: str, store_url: str, cluster: str | None) -> Config:
    """The configuration of a workspace under ``root`` attached to the cluster (nothing opened yet;
    ``cluster`` None: a placeholder the checks replace with the one registered cluster)."""
    if not store_url:
        raise AttachError("--pulsar-zk needs --store-url: the cluster's bucket (e.g. s3://BUCKET?region=...)")
    location = parse_store_url(store_url)
    if location.prefix:
        raise AttachError(f"--store-url {store_url}: Pulsar's offloaders write keys without a prefix "
                          f"({{uuid}}-ledger-{{id}}), so the URL names the bucket alone, not {location.prefix!r}")
    return Config.for_workspace(root, metadata_url=metadata_url(pulsar_zk), hot_url=BOOKKEEPER_URL,
                                store_url=store_url, cluster=cluster or "standalone")


def check_attach(config: Config, cluster_given: bool, brokers_default: bool) -> tuple[Config, Attachment]:
    """Reads (never writes) the cluster's ZooKeeper: the layout, the cluster, the bucket (module docstring).
    Returns the configuration with the cluster's name and what was found; AttachError otherwise."""
    try:
        store = ZkMetadataStore(config.metadata_url)
    except MetadataStoreError as e:
        raise AttachError(f"cannot attach: {e}") from None
    try:
        records = PulsarRecords(store)
        where = _where(config)
        missing = records.layout_problems()
        if missing:
            raise AttachError(f"{where} holds no Pulsar cluster ({', '.join(missing)}): is the chroot right? "
                              "(--pulsar-zk takes Pulsar's metadataStoreUrl, chroot included)")
        cluster = _cluster(records, config.cluster if cluster_given else None, where)
        config = replace(config, cluster=cluster)
        policies = PulsarPolicyStore(ManagedLedgerStore(store), cluster=cluster)
        namespaces = sorted(set(policies.ml.list_namespaces()) | set(policies.ml.list_policy_namespaces()))
        named_by = _named_by(policies, namespaces, config.store_location)
        brokers_default = brokers_default or config.brokers_default  # stated now, or when first attached
        if not named_by and not brokers_default:
            raise AttachError(_bucket_refusal(config, policies, namespaces))
        config = replace(config, brokers_default=brokers_default)
        return config, Attachment(cluster, namespaces, named_by, brokers_default)
    finally:
        store.close()


def _where(config: Config) -> str:
    loc = ZkLocation.parse(config.metadata_url)
    return f"ZooKeeper {loc.hosts}{loc.chroot or '/'}"


def _cluster(records: PulsarRecords, given: str | None, where: str) -> str:
    known = records.clusters()
    if given is not None:
        if given not in known:
            raise AttachError(f"cluster {given!r} is not registered in {where} (/admin/clusters holds: "
                              f"{', '.join(known) or 'none'}): check --cluster")
        return given
    if len(known) != 1:
        raise AttachError(f"{where} registers {len(known)} clusters ({', '.join(known) or 'none'}): name the one "
                          "whose brokers offload to this bucket with --cluster")
    return known[0]


def _bucket_of(location: StoreLocation) -> tuple[str, str]:
    return location.scheme, location.bucket or location.root


def _named_by(policies: PulsarPolicyStore, namespaces: list[str], location: StoreLocation) -> list[str]:
    """The namespaces whose offload policies name the bucket of ``location`` (unreadable policies skipped)."""
    out = []
    for ns in namespaces:
        try:
            spec = policies.pulsar(ns).store
        except FormatError as e:
            log.warning("attach: namespace %s: its policies cannot be read: %s", ns, e)
            continue
        if spec is not None and _bucket_of(spec.location()) == _bucket_of(location):
            out.append(ns)
    return out


def _bucket_refusal(config: Config, policies: PulsarPolicyStore, namespaces: list[str]) -> str:
    named = set()
    for ns in namespaces:
        try:
            spec = policies.pulsar(ns).store
        except FormatError:
            continue
        if spec is not None:
            named.add(spec.location().url().split("?")[0].rstrip("/"))
    scheme, bucket = _bucket_of(config.store_location)
    return (f"the bucket {bucket!r} ({scheme}) of --store-url is named by no namespace's offload policies in "
            f"cluster {config.cluster!r} (they name: {', '.join(sorted(named)) or 'no bucket'}); if it is the "
            "brokers' default offload bucket (broker.conf), say so with --brokers-default")
