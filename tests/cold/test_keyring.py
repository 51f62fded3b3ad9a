"""Key rings of RSA keys wrapping data keys: wrap/unwrap, several keys, activation, retirement, and clear
errors for missing, wrong or unreadable keys."""

from __future__ import annotations

import os

import pytest

from tieredcore.cold.keyring import KeyRing, KeyRingError, split_wrapped
from tieredcore.errors import NotFoundError, ValidationError
from tieredcore.formats.transform import new_data_key


@pytest.fixture(scope="module")
def ring_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ring") / "ring"
    KeyRing.add_key(d, "k1", bits=2048)
    KeyRing.add_key(d, "k2", bits=2048, activate=False)
    return d


def test_wrap_unwrap_and_rotation(ring_dir):
    ring = KeyRing.load(ring_dir)
    assert ring.active_id == "k1" and set(ring.keys) == {"k1", "k2"}
    dek = new_data_key()
    w1 = ring.wrap(dek)
    kid, blob = split_wrapped(w1)
    assert kid == "k1" and len(blob) == 256
    assert ring.unwrap(w1) == dek
    w2 = ring.wrap(dek, "k2")
    assert w2.startswith("k2:") and ring.unwrap(w2) == dek
    assert oct((ring_dir / "k1.pem").stat().st_mode & 0o777) == "0o600"


def test_activate_and_retire(tmp_path):
    ring = KeyRing.add_key(tmp_path / "r", "old", bits=2048)
    dek = new_data_key()
    old = ring.wrap(dek)
    ring = KeyRing.add_key(tmp_path / "r", "new", bits=2048)
    assert ring.active_id == "new" and ring.unwrap(old) == dek
    with pytest.raises(ValidationError, match="is the active key"):
        ring.retire("new")
    ring.retire("old")
    ring = KeyRing.load(tmp_path / "r")
    assert set(ring.keys) == {"new"}
    with pytest.raises(KeyRingError, match="key old, which is not on key ring .*restore its PEM"):
        ring.unwrap(old)


def test_wrong_key_under_same_id(tmp_path, ring_dir):
    dek = new_data_key()
    wrapped = KeyRing.load(ring_dir).wrap(dek)
    other = KeyRing.add_key(tmp_path / "other", "k1", bits=2048)
    with pytest.raises(KeyRingError, match="does not unwrap"):
        other.unwrap(wrapped)


def test_bad_rings(tmp_path):
    with pytest.raises(NotFoundError, match="no such directory"):
        KeyRing.load(tmp_path / "missing")
    d = tmp_path / "r"
    KeyRing.add_key(d, "a", bits=2048)
    (d / "active").write_text("zzz\n")
    with pytest.raises(ValidationError, match="active key 'zzz' has no zzz.pem"):
        KeyRing.load(d)
    (d / "active").write_text("a\n")
    os.chmod(d / "a.pem", 0o644)
    with pytest.raises(ValidationError, match="readable by others"):
        KeyRing.load(d)
    os.chmod(d / "a.pem", 0o600)
    (d / "b.pem").write_text("not a key")
    os.chmod(d / "b.pem", 0o600)
    with pytest.raises(ValidationError, match="b.pem is not an unencrypted PEM"):
        KeyRing.load(d)
    with pytest.raises(ValidationError, match="never ':'"):
        KeyRing.add_key(d, "a:b")
    with pytest.raises(ValidationError, match="at least 2048"):
        KeyRing.add_key(d, "c", bits=1024)
    for bad in ("nocolon", "k1:@@@"):
        with pytest.raises(KeyRingError):
            split_wrapped(bad)
