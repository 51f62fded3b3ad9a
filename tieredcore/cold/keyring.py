"""Key rings of RSA key-encryption keys (spec/04 "Encryption"): envelope encryption of data keys.

A key ring is a directory of PEM files, one RSA private key (>= 2048 bits) per key id (``<id>.pem``;
ids are ``[A-Za-z0-9_.-]``, never ``:``), and a file ``active`` naming the id that wraps new data keys.
Older keys stay on the ring so that data keys they wrapped can still be unwrapped; a rotation re-wraps
those under the active key (rewriting only manifests) before an old key may be retired.

A wrapped data key is stored as ``"<kekId>:<base64(RSA-OAEP-SHA256(data key))>"``.

The private keys are secrets: the directory should be readable by the service user only (a ring whose
files others can read is refused unless ``allow_shared_permissions``), and backed up — objects whose
data key was wrapped only by a lost key cannot be read by anyone.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tieredcore.errors import NotFoundError, TieredError, ValidationError

__all__ = ["ACTIVE_FILE", "KeyRing", "KeyRingError", "split_wrapped"]

ACTIVE_FILE = "active"
MIN_RSA_BITS = 2048
DEFAULT_RSA_BITS = 3072
_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_OAEP = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()), algorithm=hashes.SHA256(), label=None)


class KeyRingError(TieredError):
    """A data key cannot be wrapped or unwrapped (missing, wrong or unreadable key)."""


def check_key_id(kek_id: str) -> str:
    if not isinstance(kek_id, str) or not _ID.match(kek_id) or kek_id in (".", ".."):
        raise ValidationError(f"key id {kek_id!r}: 1-64 characters of A-Z a-z 0-9 _ . - (never ':')")
    return kek_id


def split_wrapped(text: str) -> tuple[str, bytes]:
    """``"<kekId>:<base64>"`` → (key id, wrapped bytes)."""
    kek_id, sep, b64 = str(text).partition(":")
    if not sep or not _ID.match(kek_id):
        raise KeyRingError(f"wrapped data key {text[:40]!r}: expected '<kekId>:<base64>'")
    try:
        return kek_id, base64.b64decode(b64.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise KeyRingError(f"wrapped data key of {kek_id}: not base64: {e}") from None


@dataclass
class KeyRing:
    path: Path
    active_id: str
    keys: dict[str, rsa.RSAPrivateKey]

    @classmethod
    def load(cls, path: str | Path, *, allow_shared_permissions: bool = False) -> KeyRing:
        root = Path(path)
        if not root.is_dir():
            raise NotFoundError(f"key ring {root}: no such directory (create one with `tiered keys new`)")
        keys: dict[str, rsa.RSAPrivateKey] = {}
        for pem in sorted(root.glob("*.pem")):
            kek_id = check_key_id(pem.stem)
            if not allow_shared_permissions and pem.stat().st_mode & 0o077:
                raise ValidationError(f"key ring {root}: {pem.name} is readable by others (chmod 600 it)")
            try:
                key = serialization.load_pem_private_key(pem.read_bytes(), password=None)
            except (ValueError, TypeError) as e:
                raise ValidationError(f"key ring {root}: {pem.name} is not an unencrypted PEM private key: {e}") from None
            if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < MIN_RSA_BITS:
                raise ValidationError(f"key ring {root}: {pem.name} is not an RSA key of at least {MIN_RSA_BITS} bits")
            keys[kek_id] = key
        active_file = root / ACTIVE_FILE
        if not active_file.exists():
            raise ValidationError(f"key ring {root}: no '{ACTIVE_FILE}' file naming the active key id")
        active = active_file.read_text().strip()
        if active not in keys:
            raise ValidationError(f"key ring {root}: active key {active!r} has no {active}.pem "
                                  f"(keys: {', '.join(sorted(keys)) or 'none'})")
        return cls(root, active, keys)

    @classmethod
    def add_key(cls, path: str | Path, kek_id: str, *, activate: bool = True, bits: int = DEFAULT_RSA_BITS) -> KeyRing:
        """Generate a new RSA key on the ring (created if absent), written 0600 atomically; make it
        active unless told not to."""
        check_key_id(kek_id)
        if bits < MIN_RSA_BITS:
            raise ValidationError(f"RSA keys of at least {MIN_RSA_BITS} bits, not {bits}")
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = root / f"{kek_id}.pem"
        if pem.exists():
            raise ValidationError(f"key ring {root}: key {kek_id} exists already")
        key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
        data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
        _write_private(pem, data)
        if activate or not (root / ACTIVE_FILE).exists():
            _write_private(root / ACTIVE_FILE, (kek_id + "\n").encode())
        return cls.load(root)

    def activate(self, kek_id: str) -> None:
        if kek_id not in self.keys:
            raise NotFoundError(f"key ring {self.path}: no key {kek_id}")
        _write_private(self.path / ACTIVE_FILE, (kek_id + "\n").encode())
        self.active_id = kek_id

    def retire(self, kek_id: str) -> Path:
        """Take a key off the ring (its PEM file renamed ``<id>.pem.retired``): the caller must have
        checked that no object still needs it. The active key cannot be retired."""
        if kek_id == self.active_id:
            raise ValidationError(f"key {kek_id} is the active key: activate another one first")
        if kek_id not in self.keys:
            raise NotFoundError(f"key ring {self.path}: no key {kek_id}")
        src = self.path / f"{kek_id}.pem"
        dst = src.with_name(src.name + ".retired")
        src.rename(dst)
        del self.keys[kek_id]
        return dst

    def wrap(self, data_key: bytes, kek_id: str | None = None) -> str:
        kid = kek_id or self.active_id
        key = self.keys.get(kid)
        if key is None:
            raise KeyRingError(f"key ring {self.path}: no key {kid}")
        return f"{kid}:{base64.b64encode(key.public_key().encrypt(data_key, _OAEP)).decode('ascii')}"

    def unwrap(self, wrapped: str) -> bytes:
        kid, blob = split_wrapped(wrapped)
        key = self.keys.get(kid)
        if key is None:
            raise KeyRingError(f"data key wrapped by key {kid}, which is not on key ring {self.path} "
                               f"(keys: {', '.join(sorted(self.keys))}); restore its PEM file to read the object")
        try:
            return key.decrypt(blob, _OAEP)
        except ValueError:
            raise KeyRingError(f"data key wrapped by key {kid} does not unwrap with {kid}.pem of key ring "
                               f"{self.path} (a different key under the same id?)") from None


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    tmp.replace(path)
