"""The private-state checks and opens (trayapp.private) and the one file that keeps a job's
environment values (trayapp.jobs.envfile), on real files, folders and a second user."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from trayapp import config as cfg
from trayapp import private
from trayapp.jobs import envfile
from trayapp.jobs.options import JobSpec

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes and owners")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's file")
NOBODY = 65534


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


# -- the runtime folder --------------------------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="hr-", dir="/tmp"))
    os.chmod(d, 0o700)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_xdg_runtime_dir_is_used_when_it_is_the_users_and_private(
        tmp_path: Path, short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / ("d" * 60) / ("e" * 60)))
    paths = cfg.get_paths()
    assert paths.runtime_dir.parent == short_dir
    assert len(paths.job_address("0123456789ab")) <= 100
    paths.ensure()
    assert mode(paths.runtime_dir) == 0o700
    private.check_runtime(paths.data_dir, paths.runtime_dir)
    # One too long for a socket address is passed over for the temporary folder.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    os.chmod(tmp_path, 0o700)
    assert cfg.get_paths().runtime_dir.parent.name == f"headroom-{os.getuid()}"


@pytest.mark.parametrize("how", ["readable", "link", "relative"])
def test_an_unsafe_xdg_runtime_dir_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               how: str) -> None:
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    os.chmod(xdg, 0o755 if how == "readable" else 0o700)
    value = str(xdg)
    if how == "link":
        (tmp_path / "link").symlink_to(xdg, target_is_directory=True)
        value = str(tmp_path / "link")
    elif how == "relative":
        value = "xdg"
    monkeypatch.setenv("XDG_RUNTIME_DIR", value)
    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / ("d" * 60) / ("e" * 60)))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    paths = cfg.get_paths()
    assert paths.runtime_dir.parent == tmp_path / f"headroom-{os.getuid()}"


def test_every_level_of_the_temporary_runtime_folder_is_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / ("d" * 60) / ("e" * 60)))
    paths = cfg.get_paths()
    top = paths.runtime_dir.parent
    top.mkdir(mode=0o700)
    os.chmod(top, 0o777)  # the upper level open to all, the lower one fine
    with pytest.raises(private.UnsafePath, match=r"can be written by other users \(mode 0777\)"):
        paths.ensure()
    os.chmod(top, 0o700)
    paths.ensure()
    os.chmod(top, 0o755)
    with pytest.raises(private.UnsafePath, match="can be read by other users"):
        private.check_runtime(paths.data_dir, paths.runtime_dir)
    os.chmod(top, 0o700)
    paths.runtime_dir.rmdir()
    (tmp_path / "elsewhere").mkdir()
    os.chmod(tmp_path / "elsewhere", 0o755)
    paths.runtime_dir.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    for check in (paths.ensure,
                  lambda: private.check_runtime(paths.data_dir, paths.runtime_dir)):
        with pytest.raises(private.UnsafePath, match="symbolic link"):
            check()
    assert mode(tmp_path / "elsewhere") == 0o755  # untouched: no chmod through the link
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_temporary_folder_others_can_write_must_be_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    run = shared / f"headroom-{os.getuid()}" / "abc"
    with pytest.raises(private.UnsafePath, match="can be written by other users"):
        private.ensure_runtime(tmp_path / "home", run)
    os.chmod(shared, 0o1777)
    private.ensure_runtime(tmp_path / "home", run)
    assert mode(run) == 0o700 and mode(run.parent) == 0o700


@as_root
def test_a_level_of_another_user_is_refused_with_the_fix(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    top = shared / f"headroom-{os.getuid()}"
    top.mkdir()
    os.chown(top, NOBODY, NOBODY)
    with pytest.raises(private.UnsafePath) as e:
        private.ensure_runtime(tmp_path / "home", top / "abc")
    text = str(e.value)
    assert str(top) in text and "nobody" in text and "TMPDIR" in text and "\n" not in text
    assert not (top / "abc").exists()


# -- files and folders ---------------------------------------------------------------------------


def test_open_private_creates_0600_and_follows_no_link(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        fd = private.open_private(tmp_path / "new.log")
        os.close(fd)
        assert mode(tmp_path / "new.log") == 0o600
        (tmp_path / "old.log").write_text("x")
        os.chmod(tmp_path / "old.log", 0o644)
        os.close(private.open_private(tmp_path / "old.log"))
        assert mode(tmp_path / "old.log") == 0o600
        victim = tmp_path / "victim"
        victim.write_text("keep me")
        (tmp_path / "link.log").symlink_to(victim)
        with pytest.raises(private.UnsafePath, match="symbolic link"):
            private.open_private(tmp_path / "link.log")
        assert victim.read_text() == "keep me"
    finally:
        os.umask(old)


def test_read_private_refuses_a_key_others_can_read(tmp_path: Path) -> None:
    key = tmp_path / "engine.key"
    key.write_bytes(b"k" * 32)
    os.chmod(key, 0o600)
    assert private.read_private(key) == b"k" * 32
    os.chmod(key, 0o640)
    with pytest.raises(private.UnsafePath, match=r"can be read by other users \(mode 0640\)"):
        private.read_private(key)


@as_root
def test_a_file_or_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "config.toml"
    f.write_text("")
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(private.UnsafePath, match="belongs to user nobody"):
        private.check_config(f)
    d = tmp_path / "jobs"
    d.mkdir()
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(private.UnsafePath, match="belongs to user nobody"):
        private.make_private_dir(d)


def test_make_private_dir_tightens_a_readable_folder_and_refuses_a_writable_one(
        tmp_path: Path) -> None:
    d = tmp_path / "home"
    d.mkdir()
    os.chmod(d, 0o755)
    private.make_private_dir(d)
    assert mode(d) == 0o700
    os.chmod(d, 0o757)
    with pytest.raises(private.UnsafePath, match=r"\(mode 0757\); fix: chmod 700 .*home"):
        private.make_private_dir(d)
    assert mode(d) == 0o757


@as_root
def test_group_write_is_refused_unless_the_group_is_the_users_alone(tmp_path: Path) -> None:
    d = tmp_path / "home"
    d.mkdir()
    # umask 002 with a user private group (root's group here): the group is the user alone.
    os.chmod(d, 0o775)
    private.make_private_dir(d)
    assert mode(d) == 0o700
    os.chown(d, 0, NOBODY)  # a group with other users in it
    os.chmod(d, 0o770)
    with pytest.raises(private.UnsafePath, match=r"can be written by other users \(mode 0770\)"):
        private.make_private_dir(d)


def test_a_config_link_to_the_users_own_file_is_allowed(tmp_path: Path) -> None:
    real = tmp_path / "dotfiles" / "headroom.toml"
    real.parent.mkdir()
    real.write_text("")
    os.chmod(real, 0o644)
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    private.check_config(link)
    assert mode(real) == 0o644  # the user's own file behind a link is left as it is
    os.chmod(real, 0o666)
    with pytest.raises(private.UnsafePath, match="can be written by other users"):
        private.check_config(link)


def test_atomic_write_is_0600_and_replaces_a_link_without_writing_through(
        tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    target = tmp_path / "spec.json"
    target.symlink_to(victim)
    cfg.atomic_write(target, "{}")
    assert victim.read_text() == "keep me"
    assert not target.is_symlink() and mode(target) == 0o600


def test_the_private_umask_keeps_the_users_for_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.umask(0o027)
    monkeypatch.setattr(private, "_user_umask", None)
    try:
        private.use_private_umask()
        assert os.umask(0o077) == 0o077
        assert private.user_umask() == 0o027
        assert private.umask_env() == {private.USER_UMASK_ENV: "027"}
        monkeypatch.setenv(private.USER_UMASK_ENV, "002")
        private.use_private_umask()
        assert private.user_umask() == 0o002 and private.USER_UMASK_ENV not in os.environ
    finally:
        os.umask(old)


# -- the environment file ------------------------------------------------------------------------


def test_hide_keeps_names_and_drops_values() -> None:
    spec = JobSpec(script="/x/train.py", env=(("API_KEY", "sekrit"), ("MODE", "fast")))
    shown = envfile.hide(spec.to_json())
    assert shown["env"] == [["API_KEY", None], ["MODE", None]]
    assert "sekrit" not in json.dumps(shown)
    assert envfile.hidden_names(shown) == ["API_KEY", "MODE"]


def test_restore_fills_hidden_values_from_the_private_file(tmp_path: Path) -> None:
    spec = JobSpec(script="/x/train.py", env=(("API_KEY", "sekrit"),))
    envfile.save(tmp_path, {"PATH": "/bin", "TOKEN": "t"}, spec.env)
    assert mode(tmp_path / envfile.FILE_NAME) == 0o600
    shown = envfile.hide(spec.to_json())
    assert JobSpec.from_json(envfile.restore(shown, tmp_path)) == spec
    assert envfile.load(tmp_path) == ({"PATH": "/bin", "TOKEN": "t"}, {"API_KEY": "sekrit"})
    with pytest.raises(ValueError, match="--env API_KEY was not kept"):
        envfile.restore(shown, tmp_path / "nothing")


def test_an_older_engines_environ_file_still_reads(tmp_path: Path) -> None:
    (tmp_path / envfile.FILE_NAME).write_text(json.dumps({"PATH": "/bin", "version": "2"}))
    os.chmod(tmp_path / envfile.FILE_NAME, 0o600)
    assert envfile.load(tmp_path) == ({"PATH": "/bin", "version": "2"}, {})


def test_an_environ_file_others_can_read_is_not_used(tmp_path: Path) -> None:
    envfile.save(tmp_path, {"PATH": "/bin"}, ())
    os.chmod(tmp_path / envfile.FILE_NAME, 0o644)
    assert envfile.load(tmp_path) == (None, {})


def test_a_config_named_elsewhere_is_checked_but_its_folder_left_as_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    os.chmod(dotfiles, 0o755)
    config = dotfiles / "headroom.toml"
    config.write_text("")
    os.chmod(config, 0o644)
    monkeypatch.setenv("HEADROOM_HOME", str(tmp_path / "home"))
    paths = cfg.get_paths(str(config))
    paths.ensure()
    assert mode(dotfiles) == 0o755 and mode(config) == 0o644
    assert mode(paths.home) == 0o700
    os.chmod(config, 0o646)
    with pytest.raises(private.UnsafePath, match="can be written by other users"):
        paths.ensure()
