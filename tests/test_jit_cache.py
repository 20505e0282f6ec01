"""The kernel cache never takes the process down (issue 15): read-only or unreadable folders, a read-only
HOME, a search path of folders, and the switch that turns the disk cache off. No GPU needed (NVRTC
compiles here).

Read-only folders are made with chmod. Where that does not stop writes (tests running as root), the
folder is made read-only by failing every write-type file operation under it with EROFS, as a read-only
mount does, so each test asserts the same behaviour either way."""

import errno
import os
import stat
import warnings
from pathlib import Path

import pytest

from gemmlab.jit import cache as jcache
from gemmlab.jit.compiler import clear_memory_cache, compile_kernel

SRC = "sgemm/k01_naive.cu"
EXPRS = ("sgemm_naive<16>", "sgemm_naive<8>")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test starts with no remembered failures, no warning given yet, no in-memory kernels, and
    the cache environment of its own choosing."""
    jcache.reset_state()
    clear_memory_cache()
    for var in ("GEMMLAB_CACHE_DIR", "GEMMLAB_DISK_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    yield
    jcache.reset_state()
    clear_memory_cache()


def _files(folder: Path) -> list[Path]:
    """Cache entries under ``folder`` (not the temp files of writes in flight)."""
    return sorted(p for p in (folder / "entries").rglob("*") if p.is_file()) if folder.exists() else []


def _abs(path) -> Path:
    return Path(os.path.normpath(os.path.abspath(os.fsdecode(path))))  # (no stat: os.stat may be patched)


def _inside(path, folder: Path) -> bool:
    if isinstance(path, int):  # a file descriptor
        return False
    p = _abs(path)
    return p == folder or folder in p.parents


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def make_read_only(folder: Path, monkeypatch, *, unreadable: bool = False) -> str:
    """Make ``folder`` (created if missing) and everything in it read-only, or also unreadable. Returns
    "chmod" when the permissions alone do that, "simulated" when they do not (root): then writes (and,
    for ``unreadable``, reads) under it fail with EROFS / EACCES from the os functions themselves."""
    folder.mkdir(parents=True, exist_ok=True)
    folder = _abs(folder)
    dir_mode = 0 if unreadable else stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP
    file_mode = 0 if unreadable else stat.S_IRUSR | stat.S_IRGRP
    for root, dirs, files in os.walk(folder, topdown=False):
        for f in files:
            os.chmod(os.path.join(root, f), file_mode)
        for d in dirs:
            os.chmod(os.path.join(root, d), dir_mode)
    os.chmod(folder, dir_mode)
    monkeypatch.undo_chmod = getattr(monkeypatch, "undo_chmod", []) + [folder]

    probe = folder / ".probe"
    try:
        probe.write_bytes(b"x")
    except OSError:
        return "chmod"
    probe.unlink()

    def refuse(code):
        raise OSError(code, os.strerror(code))

    real_open, real_mkdir, real_replace, real_unlink, real_utime = os.open, os.mkdir, os.replace, os.unlink, os.utime

    def fake_open(path, flags, *args, **kwargs):
        if _inside(path, folder) and (unreadable or flags & _WRITE_FLAGS):
            refuse(errno.EACCES if unreadable else errno.EROFS)
        return real_open(path, flags, *args, **kwargs)

    def fake_mkdir(path, *args, **kwargs):
        if _inside(path, folder):
            if os.path.isdir(path):
                refuse(errno.EEXIST)  # what a read-only mount answers for a folder that exists
            refuse(errno.EROFS)
        return real_mkdir(path, *args, **kwargs)

    def guard(real):
        def fake(path, *args, **kwargs):
            if _inside(path, folder):
                refuse(errno.EROFS)
            return real(path, *args, **kwargs)
        return fake

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    monkeypatch.setattr(os, "replace", lambda src, dst, *a, **k: (refuse(errno.EROFS) if _inside(dst, folder)
                                                                   else real_replace(src, dst, *a, **k)))
    monkeypatch.setattr(os, "unlink", guard(real_unlink))
    monkeypatch.setattr(os, "utime", guard(real_utime))
    if unreadable:  # a folder without search permission: nothing below it can even be stat-ed
        real_scandir, real_stat = os.scandir, os.stat
        monkeypatch.setattr(os, "scandir", lambda path=".": (refuse(errno.EACCES) if _inside(path, folder)
                                                             else real_scandir(path)))
        monkeypatch.setattr(os, "stat", lambda path, *a, **k: (
            refuse(errno.EACCES) if _inside(path, folder) and _abs(path) != folder
            else real_stat(path, *a, **k)))
    return "simulated"


@pytest.fixture(autouse=True)
def restore_permissions(monkeypatch):
    """Give chmod-ed folders their permissions back so tmp_path can be cleaned up."""
    yield
    for folder in getattr(monkeypatch, "undo_chmod", []):
        for root, dirs, _ in os.walk(folder):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        os.chmod(folder, 0o755)
        for root, _, files in os.walk(folder):
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)


def _compile(expr: str, **kw):
    return compile_kernel(SRC, expr, arch="sm_90", **kw)


def _populate(folder: Path, expr: str) -> None:
    """A cache folder holding ``expr``'s kernel, written the normal way."""
    assert _compile(expr, cache_path=folder).cache_status == "miss"
    assert len(_files(folder)) == 1
    clear_memory_cache()


def _cache_warnings(record) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, jcache.KernelCacheWarning)]


@pytest.mark.parametrize("populated", [False, True], ids=["empty", "existing-cache"])
def test_read_only_cache_dir_compiles_in_memory_with_one_warning(tmp_path, monkeypatch, populated):
    """GEMMLAB_CACHE_DIR on a read-only mount: every compile still works (two kernels, each a miss),
    nothing is written there, and the process hears about it once."""
    ro = tmp_path / "ro"
    if populated:
        _populate(ro, "sgemm_naive<32>")  # a cache made earlier, without the kernels asked for now
    before = _files(ro)
    make_read_only(ro, monkeypatch)
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(ro))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = [_compile(expr) for expr in EXPRS]
        clear_memory_cache()
        again = _compile(EXPRS[0])
    assert [k.cache_status for k in got] == ["miss", "miss"] and again.cache_status == "miss"
    assert all(k.cubin[:4] == b"\x7fELF" for k in got + [again])
    (warning,) = _cache_warnings(record)
    assert str(ro) in str(warning.message) and "GEMMLAB_CACHE_DIR" in str(warning.message)
    assert _files(ro) == before


def test_read_only_home_compiles_in_memory_with_one_warning(tmp_path, monkeypatch):
    """No GEMMLAB_CACHE_DIR and a read-only HOME (a container with a read-only root file system):
    the default folder ~/.cache/gemmlab cannot be created."""
    home = tmp_path / "home"
    make_read_only(home, monkeypatch)
    monkeypatch.setenv("HOME", str(home))
    assert jcache.cache_dirs() == [home / ".cache" / "gemmlab"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert [_compile(expr).cache_status for expr in EXPRS] == ["miss", "miss"]
    assert len(_cache_warnings(record)) == 1
    assert not (home / ".cache").exists()


def test_read_only_cache_that_holds_the_kernel_serves_it(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    _populate(ro, EXPRS[0])
    first = _files(ro)[0].read_bytes()
    make_read_only(ro, monkeypatch)
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(ro))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hit = _compile(EXPRS[0])
    assert hit.cache_status == "hit" and hit.cubin in first
    assert not _cache_warnings(record)


def test_search_path_reads_every_folder_and_writes_the_first_writable(tmp_path, monkeypatch):
    """GEMMLAB_CACHE_DIR=ro:rw: a kernel in the read-only folder is served from it; a new one is written
    to rw (no warning: that is what the search path is for) and served from rw next time."""
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    _populate(ro, EXPRS[0])
    make_read_only(ro, monkeypatch)
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", os.pathsep.join([str(ro), "", str(rw)]))
    assert jcache.cache_dirs() == [ro, rw] and jcache.cache_dir() == ro
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert _compile(EXPRS[0]).cache_status == "hit"
        assert _compile(EXPRS[1]).cache_status == "miss"
        clear_memory_cache()
        assert _compile(EXPRS[1]).cache_status == "hit"
    assert not _cache_warnings(record)
    assert len(_files(ro)) == 1 and len(_files(rw)) == 1


def test_search_path_prefers_the_first_folder_that_has_the_entry(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    _populate(b, EXPRS[0])
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", os.pathsep.join([str(a), str(b)]))
    assert _compile(EXPRS[0]).cache_status == "hit"  # found in b, the second folder
    assert not (a / "entries").exists()  # a read never creates a folder
    assert _compile(EXPRS[1]).cache_status == "miss"
    assert len(_files(a)) == 1  # written to the first folder, which is writable


def test_unreadable_folder_is_skipped_with_one_warning(tmp_path, monkeypatch):
    bad, good = tmp_path / "bad", tmp_path / "good"
    _populate(bad, EXPRS[0])
    make_read_only(bad, monkeypatch, unreadable=True)
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", os.pathsep.join([str(bad), str(good)]))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert [_compile(expr).cache_status for expr in EXPRS] == ["miss", "miss"]
    assert len(_cache_warnings(record)) == 1
    assert len(_files(good)) == 2


def test_damaged_entry_in_a_read_only_folder_is_rebuilt_into_the_writable_one(tmp_path, monkeypatch):
    ro, rw = tmp_path / "ro", tmp_path / "rw"
    _populate(ro, EXPRS[0])
    (entry,) = _files(ro)
    entry.write_bytes(b"not a cache entry")
    make_read_only(ro, monkeypatch)
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", os.pathsep.join([str(ro), str(rw)]))
    assert _compile(EXPRS[0]).cache_status == "rebuilt"
    assert entry.read_bytes() == b"not a cache entry"  # the read-only folder keeps it
    clear_memory_cache()
    assert _compile(EXPRS[0]).cache_status == "hit"  # the damaged copy is passed over for rw's


@pytest.mark.parametrize("value", ["0", "false", "off", "NO"])
def test_disk_cache_switch_keeps_everything_in_memory(tmp_path, monkeypatch, value):
    folder = tmp_path / "cache"
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(folder))
    monkeypatch.setenv("GEMMLAB_DISK_CACHE", value)
    assert not jcache.disk_cache_enabled()
    assert _compile(EXPRS[0]).cache_status == "miss"
    clear_memory_cache()
    assert _compile(EXPRS[0]).cache_status == "miss"  # nothing was kept on disk
    assert not folder.exists()
    monkeypatch.setenv("GEMMLAB_DISK_CACHE", "1")
    clear_memory_cache()
    assert _compile(EXPRS[0]).cache_status == "miss" and len(_files(folder)) == 1


def test_explicit_cache_path_that_is_read_only_falls_back_to_memory(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    make_read_only(ro, monkeypatch)
    with pytest.warns(jcache.KernelCacheWarning, match="kept in memory"):
        assert _compile(EXPRS[0], cache_path=ro).cache_status == "miss"


def test_cache_dirs_parsing(tmp_path, monkeypatch):
    home = tmp_path / "h"
    monkeypatch.setenv("HOME", str(home))
    assert jcache.cache_dirs() == [home / ".cache" / "gemmlab"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert jcache.cache_dirs() == [tmp_path / "x" / "gemmlab"]
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", os.pathsep)  # nothing but separators: the default
    assert jcache.cache_dirs() == [tmp_path / "x" / "gemmlab"]
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", f"~/a{os.pathsep}{tmp_path / 'b'}")
    assert jcache.cache_dirs() == [home / "a", tmp_path / "b"]
    assert jcache.cache_dir() == home / "a"
