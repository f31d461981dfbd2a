"""NCCL's configuration files read as NCCL's ``initEnv`` reads them (src/misc/param.cc, v2.18.3-1 to v2.30.7-1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.discover import nccl_config
from conformance.discover.nccl_config import (
    ConfigValue,
    NcclConfig,
    config_files,
    neutralised,
    parse_config,
    read_nccl_config,
)


def test_a_line_is_split_at_its_first_equals_sign_and_nothing_is_trimmed() -> None:
    text = (
        "NCCL_P2P_LEVEL=LOC\n# NCCL_DEBUG=INFO\nno equals sign\n\nNCCL_IB_HCA==mlx5_0\nNCCL_X= spaced \n"
        "NCCL_P2P_LEVEL=NVL"
    )
    assert parse_config(text, "f") == {
        "NCCL_P2P_LEVEL": ConfigValue("LOC", "f"),  # the first line naming it: setenv(..., 0) keeps it
        "NCCL_IB_HCA": ConfigValue("=mlx5_0", "f"),
        "NCCL_X": ConfigValue(" spaced ", "f"),
    }


def test_a_nul_ends_a_line_as_nccl_s_c_strings_do() -> None:
    """Before the ``=`` the line has none (skipped); in the value it ends the value: no name or value holds a NUL.

    A NUL in a name reached os.environ as the clean rung emptied it: ``ValueError: embedded null byte``.
    """
    text = "NCCL_A\0B=1\nNCCL_SOCKET_IFNAME=eth0\0junk\nNCCL_C=\0\n"
    assert parse_config(text, "f") == {"NCCL_SOCKET_IFNAME": ConfigValue("eth0", "f"), "NCCL_C": ConfigValue("", "f")}


@pytest.mark.parametrize(
    ("environ", "version", "read"),
    [
        ({}, (2, 27, 3), ["/home/u/.nccl.conf", "/etc/nccl.conf"]),
        ({"NCCL_CONF_FILE": "/opt/my.conf"}, (2, 23, 4), ["/opt/my.conf", "/etc/nccl.conf"]),  # instead of ~
        ({"NCCL_CONF_FILE": "/opt/my.conf"}, (2, 22, 3), ["/home/u/.nccl.conf", "/etc/nccl.conf"]),  # not read yet
        ({"NCCL_CONF_FILE": ""}, (2, 27, 3), ["/home/u/.nccl.conf", "/etc/nccl.conf"]),  # empty: as unset
        ({"NCCL_CONF_FILE": "/opt/my.conf"}, None, ["/opt/my.conf", "/etc/nccl.conf"]),  # unknown: the newest rule
    ],
)
def test_the_files_in_nccl_s_order(
    environ: dict[str, str], version: tuple[int, int, int] | None, read: list[str]
) -> None:
    assert [str(p) for p in config_files(environ, version, "/home/u")] == read


def test_the_environment_wins_then_the_first_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc, mine = tmp_path / "etc.conf", tmp_path / "my.conf"
    etc.write_text("NCCL_P2P_LEVEL=LOC\nNCCL_SHM_DISABLE=1\nNCCL_DEBUG=WARN\n")
    mine.write_text("NCCL_SHM_DISABLE=0\n")
    monkeypatch.setattr(nccl_config, "ETC_FILE", etc)
    environ = {"NCCL_CONF_FILE": str(mine), "NCCL_DEBUG": "INFO"}
    config = read_nccl_config(environ, (2, 27, 3))
    assert config.files == (str(mine), str(etc))
    assert config.values["NCCL_SHM_DISABLE"] == ConfigValue("0", str(mine))
    seen = config.environment(environ)
    assert (seen["NCCL_P2P_LEVEL"], seen["NCCL_SHM_DISABLE"], seen["NCCL_DEBUG"]) == ("LOC", "0", "INFO")
    assert "NCCL config " + str(etc) + ": NCCL_DEBUG=WARN (the environment's 'INFO' wins)" in config.header_lines(
        environ
    )
    # what removes a file's variable: an empty value (the environment wins); the environment's own is unset
    assert neutralised(["NCCL_P2P_LEVEL", "NCCL_DEBUG"], config, environ) == {"NCCL_P2P_LEVEL": ""}
    assert NcclConfig.from_json(config.to_json()) == config


def test_the_home_file_is_the_user_s_from_the_password_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".nccl.conf").write_text("NCCL_NVLS_ENABLE=0\n")
    monkeypatch.setattr(nccl_config, "user_home", lambda: str(tmp_path))
    monkeypatch.setattr(nccl_config, "ETC_FILE", tmp_path / "absent")
    monkeypatch.setenv("HOME", "/nowhere")  # NCCL asks getpwuid, not $HOME
    config = read_nccl_config({}, (2, 27, 3))
    assert config.values == {"NCCL_NVLS_ENABLE": ConfigValue("0", str(tmp_path / ".nccl.conf"))}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_said_not_skipped_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    etc = tmp_path / "nccl.conf"
    etc.write_text("NCCL_P2P_LEVEL=LOC\n")
    etc.chmod(0)
    monkeypatch.setattr(nccl_config, "ETC_FILE", etc)
    monkeypatch.setattr(nccl_config, "user_home", lambda: None)
    config = read_nccl_config({}, None)
    assert config.unreadable == (f"{etc}: Permission denied",)
    assert config.header_lines({}) == [f"NCCL config NOT read: {etc}: Permission denied"]


def test_a_file_that_is_not_a_regular_one_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "nccl.conf"
    os.mkfifo(fifo)  # a FIFO would block NCCL's fopen too; the suite never waits on it
    monkeypatch.setattr(nccl_config, "ETC_FILE", fifo)
    monkeypatch.setattr(nccl_config, "user_home", lambda: None)
    (why,) = read_nccl_config({}, None).unreadable
    assert why.startswith(f"{fifo}: ") and "not a regular file" in why
