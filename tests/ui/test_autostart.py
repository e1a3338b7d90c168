"""Start at login: the XDG autostart file (Linux) and the per-user Run key (Windows), for real."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

from trayapp.ui import autostart

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG autostart")
windows_only = pytest.mark.skipif(sys.platform != "win32", reason="the Windows Run key")


def parse_exec(value: str) -> list:
    """The Exec value back to argv as the Desktop Entry spec reads it: string escapes first,
    then arguments split on spaces, where double quotes group and a backslash escapes
    ``"`$\\`` inside them."""
    text = value.replace("\\\\", "\\")
    args, current, quoted, started, i = [], [], False, False, 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\" and i + 1 < len(text) and text[i + 1] in '"`$\\':
            current.append(text[i + 1])
            i += 2
            continue
        if c == '"':
            quoted, started = not quoted, True
        elif c == " " and not quoted:
            if started or current:
                args.append("".join(current))
            current, started = [], False
        else:
            current.append(c)
        i += 1
    if started or current:
        args.append("".join(current))
    return [a.replace("%%", "%") for a in args]


def read_entry(path: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(path.read_text(encoding="utf-8"))
    return parser["Desktop Entry"]


@pytest.mark.parametrize("argv", [
    ["/usr/bin/python3", "-m", "trayapp"],
    ["/home/a b/venv/bin/python", "-m", "trayapp"],
    ["/opt/it's $HOME/py`x`", "--config", "C:\\odd\\path\\100%.toml"],
    ['/tmp/quote"in/name', "--open", "dashboard"],
])
def test_exec_line_reads_back_as_the_same_argv(argv: list) -> None:
    assert parse_exec(autostart.exec_line(argv)) == argv


def test_plain_arguments_are_not_quoted() -> None:
    assert autostart.exec_line(["/usr/bin/headroom", "--demo"]) == "/usr/bin/headroom --demo"


@linux_only
def test_autostart_file_written_and_removed(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    target = tmp_path / "cfg" / "autostart" / "headroom.desktop"
    assert autostart.autostart_file() == target
    assert not autostart.is_enabled()

    argv = [str(tmp_path / "my env" / "python"), "-m", "trayapp"]
    where = autostart.enable(argv)
    assert where == str(target)
    assert autostart.is_enabled()
    entry = read_entry(target)
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Headroom"
    assert parse_exec(entry["Exec"]) == argv
    assert entry["X-GNOME-Autostart-enabled"] == "true"

    # Enabling twice replaces the entry (a new interpreter path), it does not add a second one.
    autostart.set_enabled(True, ["/usr/bin/headroom"])
    assert parse_exec(read_entry(target)["Exec"]) == ["/usr/bin/headroom"]
    assert [p.name for p in target.parent.iterdir()] == ["headroom.desktop"]

    assert autostart.disable() is True
    assert not target.exists()
    assert not autostart.is_enabled()
    assert autostart.disable() is False  # already off: nothing to remove, no error


@linux_only
def test_default_folder_is_under_home_config(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert autostart.autostart_file() == tmp_path / ".config" / "autostart" / "headroom.desktop"
    # A relative XDG_CONFIG_HOME is invalid by the spec and ignored.
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/cfg")
    assert autostart.autostart_dir() == tmp_path / ".config" / "autostart"


@linux_only
def test_entry_switched_off_by_the_desktop_counts_as_off(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    autostart.enable(["/usr/bin/headroom"])
    path = autostart.autostart_file()
    path.write_text(path.read_text().replace("X-GNOME-Autostart-enabled=true",
                                             "X-GNOME-Autostart-enabled=false"))
    assert not autostart.is_enabled()
    autostart.enable(["/usr/bin/headroom"])
    assert autostart.is_enabled()


@linux_only
def test_unwritable_folder_is_one_line_error(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "cfg"
    blocker.write_text("a file where the folder should be")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    with pytest.raises(autostart.AutostartError) as info:
        autostart.enable(["/usr/bin/headroom"])
    assert "cannot write" in str(info.value)
    assert "\n" not in str(info.value)


def test_launch_command_starts_the_tray() -> None:
    argv = autostart.launch_command()
    assert argv[1:] == ["-m", "trayapp"]
    # The command really starts Headroom's command line (here: its version).
    out = subprocess.run(argv + ["--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith("headroom ")


@windows_only
def test_run_key_written_and_removed() -> None:  # pragma: no cover - Windows only
    import winreg  # Windows only

    name = "HeadroomTest"
    argv = [r"C:\Program Files\Headroom\headroom.exe", "--demo"]
    try:
        autostart.enable(argv, value_name=name)
        assert autostart.is_enabled(name)
        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, autostart.RUN_KEY) as key:
            value, kind = winreg.QueryValueEx(key, name)
        assert kind == winreg.REG_SZ
        assert value == '"C:\\Program Files\\Headroom\\headroom.exe" --demo'
        assert autostart.disable(name) is True
        assert not autostart.is_enabled(name)
    finally:
        autostart.disable(name)
