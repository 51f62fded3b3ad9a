"""azure:// and gs:// store URLs: parsing (clear errors, no I/O), the driver metadata Pulsar's offloaders
record (``azureblob`` / ``google-cloud-storage``), opening with credentials from the environment only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tieredcore.cold.location import StoreLocation, open_blob_store, parse_store_url
from tieredcore.config import Config
from tieredcore.errors import ValidationError

BASE = dict(metadata_url="sqlite:///m.db", hot_url="file:///h")
AZ_ENV = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY",
          "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_BLOB_ENDPOINT")
GCS_ENV = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT")

REJECTED = [
    ("azure://", "missing container in 'azure://' .expected azure://container/prefix."),
    ("azure:///p", "missing container"),
    ("azure://ab/p", "bad Azure container name 'ab'"),
    ("azure://Logs/p", "bad Azure container name 'Logs'"),
    ("azure://a--b/p", "bad Azure container name 'a--b'"),
    ("azure://-ab/p", "bad Azure container name"),
    ("azure://my_container/p", "bad Azure container name"),
    ("azure://cont/../p", "must be relative, without '..'"),
    ("azure://cont/p?region=westeurope", r"unknown parameter\(s\) region for azure:// URLs"),
    ("azure://cont/p?retry_mode=standard", "unknown parameter"),
    ("azure://cont/p?endpoint=ftp://h:1", "endpoint must be an http:// or https:// URL"),
    ("azure://cont/p?endpoint=http://h:1/a/b", r"must be scheme://host\[:port\]\[/account\]"),
    ("azure://cont/p?endpoint=http://h:1/Dev_Account", r"must be scheme://host\[:port\]\[/account\]"),
    ("azure://cont/p?endpoint=http://h:1/acct?x=1", r"must be scheme://host\[:port\]\[/account\]"),
    ("azure://cont/p?max_attempts=0", "max_attempts must be an integer from 1 to 20"),
    ("azure://cont/p?read_timeout=forever", "read_timeout must be a duration"),
    ("azure://acct:key@cont/p", "no user:password@ in store URLs"),
    ("gs://", "missing bucket in 'gs://' .expected gs://bucket/prefix."),
    ("gs://ab/p", "bad GCS bucket name 'ab'"),
    ("gs://goog-logs/p", "bad GCS bucket name 'goog-logs'"),
    ("gs://my-google-logs/p", "bad GCS bucket name"),
    ("gs://192.168.1.10/p", "bad GCS bucket name"),
    ("gs://a..b/p", "bad GCS bucket name"),
    ("gs://Bucket/p", "bad GCS bucket name"),
    ("gs://" + "a" * 64 + "/p", "bad GCS bucket name"),
    ("gs://bkt/p?region=eu", r"unknown parameter\(s\) region for gs:// URLs"),
    ("gs://bkt/p?endpoint=http://h:1/storage", r"must be scheme://host\[:port\] only"),
    ("gs://bkt/p?endpoint=http://user:pw@h:1", "must not contain credentials"),
    ("gs://bkt/p?connect_timeout=0", "connect_timeout must be a duration"),
]


@pytest.mark.parametrize(("url", "match"), REJECTED)
def test_bad_cloud_urls_are_refused_with_the_reason(url: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match) as e:
        parse_store_url(url)
    assert str(e.value).startswith("store_url: ")
    with pytest.raises(ValidationError, match=match):
        Config(**BASE, store_url=url)
    with pytest.raises(ValidationError, match=match):
        open_blob_store(url)


def test_no_secret_reaches_a_message() -> None:
    for url in ("azure://acct:s3cr3tkey@cont/p", "gs://bkt/p?endpoint=http://u:s3cr3tkey@h:1"):
        with pytest.raises(ValidationError) as e:
            parse_store_url(url)
        assert "s3cr3tkey" not in str(e.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("azure://offload", StoreLocation("azure", bucket="offload")),
        ("azure://offload-1/a%20b/c", StoreLocation("azure", bucket="offload-1", prefix="a b/c/")),
        ("azure://cont/p?endpoint=http://127.0.0.1:10000/devstoreaccount1&max_attempts=2&read_timeout=5s",
         StoreLocation("azure", bucket="cont", prefix="p/", endpoint="http://127.0.0.1:10000/devstoreaccount1",
                       max_attempts=2, read_timeout=5.0)),
        ("azure://cont/p?endpoint=https://acct.blob.core.windows.net",
         StoreLocation("azure", bucket="cont", prefix="p/", endpoint="https://acct.blob.core.windows.net")),
        ("gs://my_bucket.logs/x/", StoreLocation("gs", bucket="my_bucket.logs", prefix="x/")),
        ("gs://bkt?endpoint=http://127.0.0.1:9023&connect_timeout=250ms",
         StoreLocation("gs", bucket="bkt", endpoint="http://127.0.0.1:9023", connect_timeout=0.25)),
    ],
)
def test_good_cloud_urls(url: str, expected: StoreLocation) -> None:
    loc = parse_store_url(url)
    assert loc == expected
    assert parse_store_url(loc.url()) == loc  # the URL a location names parses back to it
    Config(**BASE, store_url=url)


def test_driver_metadata_follows_pulsar() -> None:
    """Pulsar's jclouds offloader (TieredStorageConfiguration.getOffloadDriverMetadata) records
    managedLedgerOffloadDriver (the JCloudBlobStoreProvider constant's name), bucket (Azure: the container),
    region and serviceEndpoint, '' when not configured; OffloadDriverMetadata.name is the provider's driver."""
    az = parse_store_url("azure://cont/p?endpoint=http://127.0.0.1:10000/devstoreaccount1")
    assert az.driver == "azureblob"
    assert az.driver_properties() == {"managedLedgerOffloadDriver": "AZURE_BLOB", "bucket": "cont", "prefix": "p/",
                                      "region": "", "serviceEndpoint": "http://127.0.0.1:10000/devstoreaccount1"}
    gs = parse_store_url("gs://bkt/q")
    assert gs.driver == "google-cloud-storage"
    assert gs.driver_properties() == {"managedLedgerOffloadDriver": "GOOGLE_CLOUD_STORAGE", "bucket": "bkt",
                                      "region": "", "serviceEndpoint": "", "prefix": "q/"}
    for loc in (az, gs):
        back = StoreLocation.from_driver_metadata(loc.driver_metadata())
        assert back == loc and back.same_objects(loc)
        assert back.driver_dict() == loc.driver_dict()


def test_a_policy_store_may_be_azure_or_gcs() -> None:
    from tieredcore.policy import StoreSpec

    spec = StoreSpec(driver="azureblob", bucket="cont", prefix="ns/")
    spec.validate("namespace a/b")
    assert spec.url() == "azure://cont/ns/"
    assert StoreSpec(driver="google-cloud-storage", bucket="bkt").location().driver == "google-cloud-storage"
    with pytest.raises(ValidationError, match="bad Azure container name 'C'"):
        StoreSpec(driver="azureblob", bucket="C").validate("namespace a/b")
    with pytest.raises(ValidationError, match="needs a bucket"):
        StoreSpec(driver="google-cloud-storage").validate("namespace a/b")
    with pytest.raises(ValidationError, match="region applies to aws-s3"):
        StoreSpec(driver="azureblob", bucket="cont", region="westeurope").validate("namespace a/b")


# --- opening: credentials from the environment only (no I/O here) -----------------------------


def test_azure_opens_with_a_connection_string_or_account_and_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from tieredcore.cold.backends.azure import AzureBlobStore

    for var in AZ_ENV:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValidationError, match="no credentials: set AZURE_STORAGE_CONNECTION_STRING, or "
                                              "AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY"):
        open_blob_store("azure://cont/p")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", "acct1")
    monkeypatch.setenv("AZURE_STORAGE_ACCESS_KEY", "a2V5")  # Pulsar's variable name
    store, prefix = open_blob_store("azure://cont/p?max_attempts=3")
    assert isinstance(store, AzureBlobStore) and prefix == "p/"
    assert store.client.url == "https://acct1.blob.core.windows.net/cont"
    assert store.service.credential.account_name == "acct1"
    monkeypatch.setenv("AZURE_STORAGE_BLOB_ENDPOINT", "http://127.0.0.1:10000/acct1")
    store, _ = open_blob_store("azure://cont/p")
    assert store.client.url == "http://127.0.0.1:10000/acct1/cont"
    # a connection string wins over account + key; the URL's endpoint over both
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       "DefaultEndpointsProtocol=https;AccountName=acct2;AccountKey=a2V5;EndpointSuffix=core.windows.net")
    store, _ = open_blob_store("azure://cont/p")
    assert store.client.url == "https://acct2.blob.core.windows.net/cont"
    store, _ = open_blob_store("azure://cont/p?endpoint=http://127.0.0.1:10001/acct2")
    assert store.client.url == "http://127.0.0.1:10001/acct2/cont"
    assert store.service.credential.account_name == "acct2"
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountKey=c2VjcmV0a2V5")
    with pytest.raises(ValidationError, match="AZURE_STORAGE_CONNECTION_STRING is not a valid") as e:
        open_blob_store("azure://cont/p")
    assert "c2VjcmV0a2V5" not in str(e.value)


def test_gcs_opens_with_the_emulator_host_or_fails_naming_the_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from tieredcore.cold.backends.gcs import GcsBlobStore

    for var in GCS_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no metadata-server probe on this machine
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud user credentials either
    with pytest.raises(ValidationError, match="no usable Google credentials .*GOOGLE_APPLICATION_CREDENTIALS.*"
                                              "STORAGE_EMULATOR_HOST"):
        open_blob_store("gs://bkt/p")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9023")
    store, prefix = open_blob_store("gs://bkt/p?max_attempts=1")
    assert isinstance(store, GcsBlobStore) and prefix == "p/" and store._retry is None
    assert store.client.api_endpoint == "http://127.0.0.1:9023"
    store, _ = open_blob_store("gs://bkt/p?endpoint=http://127.0.0.1:9999")
    assert store.client.api_endpoint == "http://127.0.0.1:9999"
    assert store.driver_properties()["serviceEndpoint"] == "http://127.0.0.1:9999"


def test_gcs_takes_a_service_account_key_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """TIERED_GCS_KEYFILE_JSON (the key itself, as the Airflow connection's keyfile_dict arrives) or
    GOOGLE_APPLICATION_CREDENTIALS (a key file): service-account credentials, the key's project. No token
    is fetched before the first request."""
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.oauth2 import service_account

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    key = {"type": "service_account", "project_id": "proj-from-key", "private_key_id": "1", "private_key": pem,
           "client_email": "tiered@proj-from-key.iam.gserviceaccount.com", "client_id": "1",
           "token_uri": "https://oauth2.googleapis.com/token"}
    for var in GCS_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIERED_GCS_KEYFILE_JSON", json.dumps(key))
    store, _ = open_blob_store("gs://bkt/p")
    assert isinstance(store.client._credentials, service_account.Credentials)
    assert store.client.project == "proj-from-key"
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "proj-env")  # the environment's project wins
    assert open_blob_store("gs://bkt/p")[0].client.project == "proj-env"
    monkeypatch.delenv("TIERED_GCS_KEYFILE_JSON")
    (tmp_path / "key.json").write_text(json.dumps(key))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
    assert isinstance(open_blob_store("gs://bkt/p")[0].client._credentials, service_account.Credentials)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(ValidationError, match="GOOGLE_APPLICATION_CREDENTIALS=.*missing.json': cannot read the key"):
        open_blob_store("gs://bkt/p")
    monkeypatch.setenv("TIERED_GCS_KEYFILE_JSON", json.dumps({**key, "private_key": "not a key"}))
    with pytest.raises(ValidationError, match="TIERED_GCS_KEYFILE_JSON: not a usable service-account key"):
        open_blob_store("gs://bkt/p")
    monkeypatch.setenv("TIERED_GCS_KEYFILE_JSON", "{not json")
    with pytest.raises(ValidationError, match="TIERED_GCS_KEYFILE_JSON is not a JSON service-account key"):
        open_blob_store("gs://bkt/p")


def test_a_missing_client_library_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "azure.storage.blob" else real(name, *a))
    with pytest.raises(ValidationError, match=r"azure:// stores need the azure.storage.blob client library: "
                                              r"install the 'azure' extra"):
        open_blob_store("azure://cont/p")
