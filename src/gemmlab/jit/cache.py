"""The on-disk cubin cache.

Storage is cuda-core's ``FileStreamProgramCache`` (atomic ``os.replace`` writes, so concurrent
processes compiling the same kernel never see a half-written file). The key is ours, computed by
``cache_key`` from every source and header the kernel includes, the NVRTC options, the target, the
template instantiation and the NVRTC version. Each entry is framed with a magic, a JSON header and a
SHA-256 of the cubin, so a truncated or corrupted file is detected (``unpack_entry`` raises) and rebuilt.

The cache never takes the process down. ``GEMMLAB_CACHE_DIR`` may be one folder or a search path
(folders joined by ``os.pathsep``): entries are read from every folder in order and written to the first
one that takes the write. A folder that cannot be read or written (a read-only mount, a read-only HOME,
missing permissions) is skipped with one ``KernelCacheWarning`` per process; when no folder takes
writes, compiled kernels stay in memory for the process (``gemmlab.jit.compiler`` memoises them).
``GEMMLAB_DISK_CACHE=0`` turns the disk cache off altogether.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_MAGIC = b"GEMMLAB-CUBIN-1\n"
FORMAT_VERSION = 1


_log = logging.getLogger("gemmlab.jit.cache")


class CorruptEntry(Exception):
    """A cache entry that fails its framing or checksum."""


class KernelCacheWarning(UserWarning):
    """A cache folder could not be read or written; gemmlab carries on without it."""


_OFF = ("0", "false", "no", "off")


def disk_cache_enabled() -> bool:
    """False when ``GEMMLAB_DISK_CACHE`` is 0/false/no/off: compiled kernels then live in memory only."""
    return os.environ.get("GEMMLAB_DISK_CACHE", "1").strip().lower() not in _OFF


def cache_dirs() -> list[Path]:
    """The cache's search path: ``GEMMLAB_CACHE_DIR`` split on ``os.pathsep`` (empty parts ignored), else
    ``[$XDG_CACHE_HOME/gemmlab]`` (``~/.cache/gemmlab``). Reads try each folder in order; writes go to the
    first that takes them."""
    override = os.environ.get("GEMMLAB_CACHE_DIR")
    if override:
        parts = [Path(p).expanduser() for p in override.split(os.pathsep) if p.strip()]
        if parts:
            return parts
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return [Path(base) / "gemmlab"]


def cache_dir() -> Path:
    """The first folder of ``cache_dirs()``: the cache's primary folder (autotune results live under it)."""
    return cache_dirs()[0]


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


# Folders that failed a read or a write in this process, and whether the one warning has been given.
# Remembered so that every later compile skips them quietly instead of failing (and warning) again.
_BROKEN: dict[tuple[Path, str], str] = {}
_WARNED = False
_STATE_LOCK = threading.Lock()


def _report(folder: Path, action: str, err: BaseException, fallback: str) -> None:
    """Remember that ``action`` ("read" or "write") failed in ``folder``; the first report of the process
    is a ``KernelCacheWarning``, later ones go to the ``gemmlab.jit.cache`` logger."""
    global _WARNED
    with _STATE_LOCK:
        _BROKEN[(folder, action)] = f"{type(err).__name__}: {err}"
        first, _WARNED = not _WARNED, True
    msg = (f"gemmlab kernel cache: cannot {action} {folder} ({type(err).__name__}: {err}); {fallback}. "
           "Point GEMMLAB_CACHE_DIR at a writable folder, or at a search path of folders joined by "
           f"{os.pathsep!r} (read from all, written to the first writable), or set GEMMLAB_DISK_CACHE=0.")
    if first:
        warnings.warn(msg, KernelCacheWarning, stacklevel=4)
    else:
        _log.info(msg)


def reset_state() -> None:
    """Forget which folders failed and that the warning was given (for tests)."""
    global _WARNED
    with _STATE_LOCK:
        _BROKEN.clear()
        _WARNED = False


def _store(folder: Path):
    from cuda.core.utils import FileStreamProgramCache

    return FileStreamProgramCache(str(folder))


class DiskCache:
    """``get``/``put``/``discard`` over a search path of cuda-core file caches. No method raises ``OSError``:
    an unreadable folder is skipped, an unwritable one passed over for the next (memory only when none
    is left), each reported once (``_report``). ``get`` raises ``CorruptEntry`` for a damaged entry."""

    def __init__(self, path: Path | Sequence[Path] | None = None):
        if path is None:
            folders = cache_dirs()
        elif isinstance(path, (str, os.PathLike)):
            folders = [Path(path)]
        else:
            folders = [Path(p) for p in path]
        self.folders = folders
        self._stores: dict[Path, object] = {}

    @property
    def path(self) -> Path:
        """The primary (first) folder."""
        return self.folders[0]

    def _open_for_reading(self, folder: Path):
        """The folder's store, or None: when it failed before, holds no cache yet, or cannot be opened
        (reported). Opening creates a folder, so only folders that hold a cache are opened here."""
        if (folder, "read") in _BROKEN:
            return None
        store = self._stores.get(folder)
        if store is not None:
            return store
        try:
            if not (folder / "entries").is_dir():  # (raises for a folder that cannot be searched)
                return None
            store = _store(folder)
        except OSError as e:
            _report(folder, "read", e, "its entries are not used")
            return None
        self._stores[folder] = store
        return store

    def get(self, key: str) -> CacheEntry | None:
        """The entry from the first folder that has it, or None. A damaged entry is discarded where
        possible and the later folders tried; ``CorruptEntry`` when a damaged entry was all there was."""
        damaged = None
        for folder in self.folders:
            store = self._open_for_reading(folder)
            if store is None:
                continue
            try:
                blob = store.get(key)
            except OSError as e:
                _report(folder, "read", e, "its entries are not used")
                continue
            if blob is None:
                continue
            try:
                return unpack_entry(bytes(blob))
            except CorruptEntry as e:
                damaged = e
                self._discard_in(folder, store, key)
        if damaged is not None:
            raise damaged
        return None

    def put(self, key: str, entry: CacheEntry) -> Path | None:
        """Write the entry to the first folder that takes it; the folder, or None (memory only). Folders
        passed over for a later one are the search path working as documented (logged, no warning);
        the warning comes when no folder takes the write."""
        blob = pack_entry(entry)
        failed: list[tuple[Path, OSError]] = []
        written = None
        for folder in self.folders:
            if (folder, "write") in _BROKEN:
                continue
            try:
                store = self._stores.get(folder)
                if store is None:
                    store = _store(folder)  # creates the folder
                store[key] = blob
            except OSError as e:
                failed.append((folder, e))
                continue
            self._stores[folder] = store
            written = folder
            break
        for folder, e in failed:
            if written is not None:
                _BROKEN[(folder, "write")] = f"{type(e).__name__}: {e}"
                _log.info("gemmlab kernel cache: cannot write %s (%s); writing to %s", folder, e, written)
            else:
                _report(folder, "write", e, "compiled kernels are kept in memory for this process only")
        return written

    def discard(self, key: str) -> None:
        """Remove the key's entry from every folder that allows it (best effort)."""
        for folder in self.folders:
            store = self._stores.get(folder)
            if store is not None:
                self._discard_in(folder, store, key)

    @staticmethod
    def _discard_in(folder: Path, store, key: str) -> None:
        try:
            del store[key]
        except KeyError:
            pass
        except OSError as e:  # a read-only folder keeps its damaged entry; later folders are tried
            _log.info("gemmlab kernel cache: cannot remove a damaged entry from %s (%s)", folder, e)
