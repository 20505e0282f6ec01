"""The on-disk cubin cache.

Storage is cuda-core's ``FileStreamProgramCache`` (atomic ``os.replace`` writes, so concurrent
processes compiling the same kernel never see a half-written file). The key is ours, computed by
``cache_key`` from every source and header the kernel includes, the NVRTC options, the target, the
template instantiation and the NVRTC version. Each entry is framed with a magic, a JSON header and a
SHA-256 of the cubin, so a truncated or corrupted file is detected (``unpack_entry`` raises) and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

_MAGIC = b"GEMMLAB-CUBIN-1\n"
FORMAT_VERSION = 1


class CorruptEntry(Exception):
    """A cache entry that fails its framing or checksum."""


def cache_dir() -> Path:
    """``GEMMLAB_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/gemmlab`` (``~/.cache/gemmlab``)."""
    override = os.environ.get("GEMMLAB_CACHE_DIR")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gemmlab"


def cache_env() -> tuple[str | None, str | None, str | None]:
    """What ``cache_dir`` reads from the environment: a cheap key for paths remembered under it."""
    env = os.environ
    return env.get("GEMMLAB_CACHE_DIR"), env.get("XDG_CACHE_HOME"), env.get("HOME")


def cache_key(*, sources: dict[str, str], options: tuple, arch: str, name_expression: str,
              nvrtc_version: tuple[int, int]) -> str:
    """A hex SHA-256 over everything that changes the cubin."""
    h = hashlib.sha256()
    h.update(f"gemmlab-cache-format={FORMAT_VERSION}\0".encode())
    for path in sorted(sources):
        h.update(path.encode() + b"\0" + sources[path].encode() + b"\0")
    h.update(repr(options).encode() + b"\0")
    h.update(f"{arch}\0{name_expression}\0{nvrtc_version}".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    cubin: bytes
    mangled_name: str
    log: str


def pack_entry(entry: CacheEntry) -> bytes:
    header = json.dumps({
        "mangled_name": entry.mangled_name,
        "log": entry.log,
        "cubin_sha256": hashlib.sha256(entry.cubin).hexdigest(),
        "cubin_size": len(entry.cubin),
    }).encode()
    return _MAGIC + struct.pack("<Q", len(header)) + header + entry.cubin


def unpack_entry(blob: bytes) -> CacheEntry:
    if not blob.startswith(_MAGIC):
        raise CorruptEntry("bad magic")
    off = len(_MAGIC)
    if len(blob) < off + 8:
        raise CorruptEntry("truncated header length")
    (hlen,) = struct.unpack_from("<Q", blob, off)
    off += 8
    if len(blob) < off + hlen:
        raise CorruptEntry("truncated header")
    try:
        header = json.loads(blob[off:off + hlen])
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptEntry(f"unreadable header: {e}") from e
    cubin = blob[off + hlen:]
    if len(cubin) != header.get("cubin_size") or hashlib.sha256(cubin).hexdigest() != header.get("cubin_sha256"):
        raise CorruptEntry("cubin checksum mismatch")
    return CacheEntry(cubin=cubin, mangled_name=header["mangled_name"], log=header["log"])


class DiskCache:
    """A thin wrapper giving ``get``/``put``/``discard`` over cuda-core's file cache."""

    def __init__(self, path: Path | None = None):
        from cuda.core.utils import FileStreamProgramCache

        self.path = Path(path) if path is not None else cache_dir()
        self.path.mkdir(parents=True, exist_ok=True)
        self._store = FileStreamProgramCache(str(self.path))

    def get(self, key: str) -> CacheEntry | None:
        """The entry, or None on a miss. Raises ``CorruptEntry`` for a damaged file."""
        blob = self._store.get(key)
        if blob is None:
            return None
        return unpack_entry(bytes(blob))

    def put(self, key: str, entry: CacheEntry) -> None:
        self._store[key] = pack_entry(entry)

    def discard(self, key: str) -> None:
        try:
            del self._store[key]
        except KeyError:
            pass
