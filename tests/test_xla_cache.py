"""Tests for the persistent XLA compilation cache's set-up (``tf_transformer.train.xla_cache``)."""

import os

from tf_transformer.train import xla_cache


def test_adds_the_flag_beside_the_user_s_other_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=0")
    directory = str(tmp_path / "xla")
    assert xla_cache.use_persistent_cache(directory) == directory
    assert os.environ["TF_XLA_FLAGS"] == f"--tf_xla_auto_jit=0 --tf_xla_persistent_cache_directory={directory}"
    assert os.path.isdir(directory)


def test_keeps_a_directory_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}/mine")
    assert xla_cache.use_persistent_cache(str(tmp_path / "ours")) == f"{tmp_path}/mine"
    assert os.environ["TF_XLA_FLAGS"] == f"--tf_xla_persistent_cache_directory={tmp_path}/mine"
    assert not (tmp_path / "ours").exists()


def test_default_directory_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert xla_cache.use_persistent_cache() == str(tmp_path / "tf-transformer" / "xla")
    assert os.environ["TF_XLA_FLAGS"] == f"--tf_xla_persistent_cache_directory={tmp_path}/tf-transformer/xla"


def test_no_cache_where_the_directory_cannot_be_made(monkeypatch, tmp_path):
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    (tmp_path / "file").write_text("not a directory")
    assert xla_cache.use_persistent_cache(str(tmp_path / "file" / "xla")) is None
    assert "TF_XLA_FLAGS" not in os.environ


def test_the_cache_keeps_its_newest_programs_within_its_size(monkeypatch, tmp_path):
    """What each run compiled stays on disk; past the limit the oldest-written go first, at a run's start."""
    directory = tmp_path / "xla"
    directory.mkdir()
    for age, name in enumerate(["newest", "newer", "older", "oldest"]):
        path = directory / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    assert xla_cache.prune(str(directory), keep_bytes=250) == 2
    assert sorted(os.listdir(directory)) == ["newer", "newest"]
    assert xla_cache.prune(str(directory), keep_bytes=250) == 0
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    monkeypatch.setattr(xla_cache, "KEEP_BYTES", 100)
    assert xla_cache.use_persistent_cache(str(directory)) == str(directory)
    assert os.listdir(directory) == ["newest"]
