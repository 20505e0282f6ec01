"""gemmlab.log: quiet by default, GEMMLAB_LOG turns the gemmlab logger on, a bad value never breaks the import."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from gemmlab import log

SRC = str(Path(__file__).resolve().parent.parent / "src")


@pytest.fixture
def restore_logger():
    log.reset()
    yield
    log.reset()


def test_levels_from_the_environment(monkeypatch):
    monkeypatch.delenv(log.ENV, raising=False)
    assert log.level_from_env() is None
    for text, level in (("debug", logging.DEBUG), (" INFO ", logging.INFO), ("warning", logging.WARNING), ("15", 15)):
        monkeypatch.setenv(log.ENV, text)
        assert log.level_from_env() == level
    monkeypatch.setenv(log.ENV, "loud")
    with pytest.raises(ValueError, match="expected one of debug, info, warning, error"):
        log.level_from_env()


def test_configure_adds_one_handler(restore_logger):
    before = len(log.logger.handlers)
    log.configure("debug")
    log.configure("info")
    assert len(log.logger.handlers) == before + 1 and log.logger.level == logging.INFO
    log.reset()
    assert len(log.logger.handlers) == before and log.logger.level == logging.NOTSET


def test_timed_logs_the_elapsed_time(restore_logger, caplog):
    log.logger.setLevel(logging.DEBUG)
    with caplog.at_level(logging.DEBUG, logger="gemmlab"):
        with log.timed("compiled %s", "k05"):
            pass
    (rec,) = [r for r in caplog.records if r.name == "gemmlab"]
    assert rec.getMessage().startswith("compiled k05 in ") and rec.getMessage().endswith(" s")
    caplog.clear()
    log.logger.setLevel(logging.WARNING)
    with log.timed("quiet %s", "x"):
        pass
    assert not caplog.records


def _run(code: str, env_value: str | None) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}
    if env_value is not None:
        env[log.ENV] = env_value
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_the_switch_at_import():
    code = "import logging, gemmlab\nlogging.getLogger('gemmlab.test').debug('hello from %s', 'gemmlab')"
    assert "hello from gemmlab" not in _run(code, None).stderr  # a library is quiet by default
    assert "gemmlab.test DEBUG: hello from gemmlab" in _run(code, "debug").stderr
    bad = _run("import gemmlab\nprint('imported')", "loud")
    assert bad.returncode == 0 and "imported" in bad.stdout and "GEMMLAB_LOG='loud'" in bad.stderr


def test_the_sass_cache_logs_at_debug(restore_logger, caplog, tmp_path, monkeypatch):
    from gemmlab import registry, sass

    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(sass, "_MEMO", {})
    log.logger.setLevel(logging.DEBUG)
    ck = registry.get("k01").compile()
    with caplog.at_level(logging.DEBUG, logger="gemmlab"):
        sass.disassemble(ck.cubin)
    assert any("disassembled cubin" in r.getMessage() for r in caplog.records)
