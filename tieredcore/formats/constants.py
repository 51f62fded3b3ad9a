"""Constants of the Pulsar-compatible offload formats (docs/formats.md ledger objects, docs/formats.md streaming).

Magic words are given as unsigned Python ints (the bit pattern Java writes with ``writeInt``);
encode them with ``>I`` and compare after reading with ``>I``.
"""

from __future__ import annotations

# --- magic words (first int32 of each structure) -----------------------------------------------

#: first 4 bytes of every V1 data block (Java int -69489717)
DATA_BLOCK_MAGIC = 0xFBDBABCB
#: first 4 bytes of a V1 (one ledger) index object
INDEX_MAGIC_V1 = 0xDE47DE47
#: first 4 bytes of a V2 (multi-ledger, streaming) index object
INDEX_MAGIC_V2 = 0x3D1FB0BC
#: first 4 bytes of every streaming (PIP-76) data block
STREAMING_BLOCK_MAGIC = 0x26A66D32

# --- data blocks --------------------------------------------------------------------------------

#: bytes of a block header; entry frames start at block offset + 128
BLOCK_HEADER_LENGTH = 128
#: magic(4) + header length(8) + block length(8) + first entry id(8)
BLOCK_HEADER_USED = 28
#: zero bytes closing a V1 block header
BLOCK_HEADER_ZEROS = BLOCK_HEADER_LENGTH - BLOCK_HEADER_USED  # 100
#: entry frame header: int32 payload length + int64 entry id
ENTRY_HEADER_SIZE = 12
#: smallest block that can hold one (empty) entry
MIN_BLOCK_SIZE = BLOCK_HEADER_LENGTH + ENTRY_HEADER_SIZE  # 140
#: block end padding pattern; padding always starts with its first byte (0xFE)
BLOCK_PADDING = b"\xfe\xdc\xde\xad"
#: default maximum block size (= multipart part size) of the ledger offloader
DEFAULT_MAX_BLOCK_SIZE = 64 * 1024 * 1024
#: default size of ranged GETs on the read path
DEFAULT_READ_BUFFER_SIZE = 1024 * 1024
#: minimum size of a streaming block (every block is an S3 part, docs/formats.md)
STREAMING_MIN_BLOCK_SIZE = 5 * 1024 * 1024
#: an entry length is a Java int
MAX_ENTRY_SIZE = 2**31 - 1

# --- index objects ------------------------------------------------------------------------------

#: V1 index fixed header: magic(4) index length(4) data length(8) header length(8) n(4) M(4)
INDEX_V1_HEADER_LENGTH = 32
#: V2 index fixed header: magic(4) index length(4) data length(8) header length(8)
INDEX_V2_HEADER_LENGTH = 24
#: V2 per-ledger section header: ledger id(8) n(4) metaLen(4)
INDEX_V2_SECTION_HEADER_LENGTH = 16
#: one index entry: firstEntryId(int64) partId(int32) blockOffset(int64)
INDEX_ENTRY_LENGTH = 20
#: optional V1 index trailer (after the entries, where Pulsar's reader ignores it): exact frame offsets
#: of entries inside blocks, so that a random read does not walk a whole block (upstream #3804).
#: Layout: magic(4) count(4) then count x [entryId:int64][frameOffset:int64], sorted.
INDEX_CHECKPOINTS_MAGIC = 0x54534331  # "TSC1"
#: default distance in frame bytes between two checkpoints (16 bytes of index per interval)
DEFAULT_CHECKPOINT_INTERVAL = 8192
#: V1 index trailer section after the checkpoints: a CRC32C per fixed-size chunk of the data object and
#: one over the index itself (docs/formats.md, tieredcore.formats.trailer)
INDEX_CHECKSUMS_MAGIC = 0x54534B31  # "TSK1"
#: default checksum chunk: a random read fetches whole chunks, so this bounds its overhead (= the
#: checkpoint interval: a random read fetches at most two chunks more than it returns)
DEFAULT_CHECKSUM_CHUNK = 8 * 1024

# --- object user metadata (keys lower-cased, as S3 returns them) --------------------------------

#: Pulsar: "S3ManagedLedgerOffloaderFormatVersion"; readers reject objects without value "1"
METADATA_FORMAT_VERSION_KEY = "s3managedledgeroffloaderformatversion"
CURRENT_FORMAT_VERSION = "1"
#: Pulsar: "S3ManagedLedgerOffloaderSoftwareVersion" (version of the writing software)
METADATA_SOFTWARE_VERSION_KEY = "s3managedledgeroffloadersoftwareversion"
#: Pulsar: "S3ManagedLedgerOffloaderSoftwareGitSha"
METADATA_SOFTWARE_GIT_SHA_KEY = "s3managedledgeroffloadersoftwaregitsha"
#: Pulsar: "role" with value "data" (data object) or "index" (index object)
METADATA_ROLE_KEY = "role"
ROLE_DATA = "data"
ROLE_INDEX = "index"
#: this project: "role" of an entry-offsets sidecar beside a Pulsar-written pair (docs/formats.md)
ROLE_OFFSETS = "offsets"
#: Pulsar: "ManagedLedgerName", e.g. "public/default/persistent/my-topic"
METADATA_MANAGED_LEDGER_NAME_KEY = "managedledgername"
#: Pulsar: "pulsarClusterName"
METADATA_CLUSTER_NAME_KEY = "pulsarclustername"
#: this project: identity of the metadata store whose workspace wrote the object (ownership checks)
METADATA_OWNER_KEY = "tieredowner"
#: this project, on index objects: "crc32c/<chunk size>" when the index trailer carries checksums (a
#: reader then refuses an index whose checksum section is missing or damaged)
METADATA_CHECKSUMS_KEY = "tieredchecksums"

# --- BookKeeper LedgerMetadataFormat values written into a V1 index (docs/metadata.md) -------------------

#: ensemble member Pulsar's offloader writes into the offloaded ledger's metadata
OFFLOADED_ENSEMBLE_MEMBER = "127.0.0.1:3181"
#: custom metadata this project adds to the ledger metadata inside an index: the ledger's id (the V1
#: format keeps it only in the key), so an index copied under another ledger's key is recognised
CUSTOM_LEDGER_ID_KEY = "tiered/ledgerId"
#: custom metadata naming the ledger's managed ledger (Pulsar's own key, docs/metadata.md)
CUSTOM_MANAGED_LEDGER_KEY = "pulsar/managed-ledger"

# Offload uploads to a store taking parts concurrently (S3): blocks are cut into parts of about this size,
# this many in flight (boto3's transfer manager: 8 MiB parts, 10 threads)
DEFAULT_UPLOAD_PART_SIZE = 8 * 1024 * 1024
DEFAULT_UPLOAD_CONCURRENCY = 4
MIN_UPLOAD_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
# a sequential reader of an offloaded object fetches windows of at least this many bytes (one GET per
# window, the next window read ahead): boto3's download_file uses 8 MiB ranges too. (16 MiB windows read
# 1.3-1.7x faster on moto, but only because moto copies the whole object for every ranged GET; on real S3
# 8-16 MiB ranges do equally well and smaller windows hold less memory per stream.)
DEFAULT_STREAM_WINDOW = 8 * 1024 * 1024
