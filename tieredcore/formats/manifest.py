"""Manifests of chunked (transformed) objects (spec/04 "Commit point"; docs/formats.md "Chunked objects").

A transformed logical object ``<key>`` is stored as two objects: ``<key>`` holding the transformed chunks
back to back, and ``<key>.manifest`` (JSON, written last: the commit point) holding what a reader needs
to serve logical byte ranges::

    {"format": "tiered-chunked", "version": 1, "object": "<key without prefix>",
     "size": F, "chunk_size": C, "index_kind": "fixed" | "variable", "index": "<base64 zstd size list>",
     "transformed_size": T, "compression": "zstd" | "none",
     "encryption": null | {"cipher": "AES-256-GCM", "data_key": "<kekId>:<base64>"},
     "metadata": {...the logical object's user metadata...}}

Both objects carry the format-version value ``tiered-chunked-1`` instead of Pulsar's ``"1"``, so a
Pulsar reader rejects them cleanly ("Invalid object version") instead of misreading them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from tieredcore.errors import FormatError
from tieredcore.formats.chunks import ChunkIndex, decode_index_text, encode_index_text
from tieredcore.formats.keys import MANIFEST_SUFFIX

__all__ = ["CIPHER", "MANIFEST_SUFFIX", "TRANSFORMED_FORMAT_VERSION", "Manifest"]

TRANSFORMED_FORMAT_VERSION = "tiered-chunked-1"
FORMAT = "tiered-chunked"
VERSION = 1
CIPHER = "AES-256-GCM"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Manifest:
    object_id: str  # the logical key without the store prefix: bound into every chunk's AAD
    index: ChunkIndex
    compression: str = "none"  # "zstd" | "none"
    data_key: str | None = None  # "<kekId>:<base64>" when encrypted
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return self.index.original_size

    @property
    def encrypted(self) -> bool:
        return self.data_key is not None

    @property
    def kek_id(self) -> str | None:
        return self.data_key.partition(":")[0] if self.data_key else None

    def with_data_key(self, data_key: str) -> Manifest:
        return replace(self, data_key=data_key)

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "object": self.object_id, "size": self.index.original_size,
            "chunk_size": self.index.chunk_size, "index_kind": self.index.kind, "index": encode_index_text(self.index),
            "transformed_size": self.index.transformed_size, "compression": self.compression,
            "encryption": {"cipher": CIPHER, "data_key": self.data_key} if self.data_key else None,
            "metadata": dict(sorted(self.metadata.items())),
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, what: str) -> Manifest:
        if len(raw) > MAX_MANIFEST_BYTES:
            raise FormatError(f"{what}: manifest of {len(raw)} bytes is implausibly large")
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise FormatError(f"{what}: manifest is not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise FormatError(f"{what}: not a {FORMAT} manifest")
        if doc.get("version") != VERSION:
            raise FormatError(f"{what}: manifest version {doc.get('version')!r}, this reader knows {VERSION}")
        try:
            size, chunk, tsize = int(doc["size"]), int(doc["chunk_size"]), int(doc["transformed_size"])
            obj, kind, text = str(doc["object"]), str(doc["index_kind"]), str(doc["index"])
            compression = str(doc["compression"])
            enc = doc.get("encryption")
            md = doc.get("metadata") or {}
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{what}: manifest field missing or malformed: {e}") from None
        if compression not in ("zstd", "none"):
            raise FormatError(f"{what}: unknown compression {compression!r}")
        data_key = None
        if enc is not None:
            if not isinstance(enc, dict) or enc.get("cipher") != CIPHER or not isinstance(enc.get("data_key"), str):
                raise FormatError(f"{what}: encryption must be {{cipher: {CIPHER}, data_key: '<kekId>:<base64>'}}")
            data_key = enc["data_key"]
        if not isinstance(md, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in md.items()):
            raise FormatError(f"{what}: metadata must map strings to strings")
        index = decode_index_text(text, kind, chunk, size, what)
        if index.transformed_size != tsize:
            raise FormatError(f"{what}: chunk sizes add up to {index.transformed_size}, the manifest says {tsize}")
        return cls(obj, index, compression, data_key, dict(md))
