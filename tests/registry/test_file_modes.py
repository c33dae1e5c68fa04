"""What the registry creates on disk is private to its owner, or shared with a team's group when configured (issue 30).

The attack: `registry.db` was created 0644 and `blobs/` 0755 with 0444 blobs under the usual umask 022, so every other
local user read every registered model. Now a fresh registry's folders are 0700, its database (and SQLite's -wal and
-shm beside it) 0600, its blobs and their temporary files 0400, whatever the umask; another user (a forked child that
became `nobody`, as root) can open none of them. NORMBRIDGE_SHARED_GROUP=1, for a team sharing a setgid NORMBRIDGE_HOME,
gives 2770 / 0660 / 0440 instead: a member of the folder's group reads and writes, anyone else still reads nothing.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from registry import file_modes
from registry.blobs.local import LocalBlobStore
from registry.service import Registry
from schemas.errors import RegistryError
from tests.registry.test_service_scale import bn_onnx_bytes

NOBODY = 65534
#: A team's group, and two users: one in it, one not (ids nobody uses here; root may become any).
TEAM_GID, MEMBER_UID, OUTSIDER_UID = 42420, 42421, 42422
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="becoming another local user (setuid) needs root")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def reachable(monkeypatch) -> Path:
    """A folder every user may traverse (pytest's own are 0700, which would hide the registry from another user for the
    wrong reason), holding NORMBRIDGE_HOME-to-be; removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="normbridge-modes-"))
    os.chmod(root, 0o755)
    for name in ("NORMBRIDGE_DB", "NORMBRIDGE_BLOBS", "NORMBRIDGE_SHARED_GROUP"):
        monkeypatch.delenv(name, raising=False)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def as_user(uid: int, action: Callable[[], None], groups: tuple[int, ...] = ()) -> int:
    """Run `action()` in a forked child that became user `uid` (with `groups`); 0 if it returned,
    the errno it raised otherwise."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.setgroups(list(groups))
            os.setgid(groups[0] if groups else uid)
            os.setuid(uid)
            action()
        except OSError as error:
            code = error.errno or 99
        except BaseException:  # noqa: BLE001  anything else is a failure the parent sees
            code = 98
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def read(path: Path) -> Callable[[], None]:
    def action() -> None:
        with open(path, "rb") as handle:
            handle.read(1)

    return action


def registry_files(home: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """(folders, database files, blob files) of the registry under `home`."""
    folders = [home, home / "blobs", *(p for p in (home / "blobs").rglob("*") if p.is_dir())]
    databases = [p for p in home.iterdir() if p.name.startswith("registry.db")]
    blobs = [p for p in (home / "blobs").rglob("*") if p.is_file()]
    return folders, databases, blobs


@pytest.mark.slow  # the registration's gate runs its other frameworks' legs in a worker process
def test_a_fresh_registry_is_private_to_its_owner_whatever_the_umask(reachable, monkeypatch):
    model = reachable / "bn.onnx"
    model.write_bytes(bn_onnx_bytes(1))
    for umask in (0o022, 0o002, 0o077):
        home = reachable / f"home_{umask:03o}"
        monkeypatch.setenv("NORMBRIDGE_HOME", str(home))
        previous = os.umask(umask)
        try:
            registry = Registry()
            if umask == 0o022:  # a real registration once; the others store a blob
                registry.register("bn", model)
            else:
                registry.store.put(b"weights")
            staged = registry.store.stage(b"not published yet")
            assert mode(staged.temporary) == 0o400, f"temporary blob under umask {umask:03o}"
            registry.store.discard(staged)
            folders, databases, blobs = registry_files(home)
            assert {p.name for p in databases} >= {
                "registry.db",
                "registry.db-wal",
                "registry.db-shm",
            }  # the engine is open
            assert blobs
            for paths, expected in ((folders, 0o700), (databases, 0o600), (blobs, 0o400)):
                found = {str(p.relative_to(reachable)): oct(mode(p)) for p in paths if mode(p) != expected}
                assert not found, f"under umask {umask:03o}, expected {expected:04o}: {found}"
            registry.meta.close()
        finally:
            os.umask(previous)


@needs_root
def test_another_local_user_cannot_read_a_blob_or_the_database(reachable, monkeypatch):
    """The attack as it was made: another user opens a registered blob and the database. Both were readable
    (0444, 0644)."""
    home = reachable / "home"
    monkeypatch.setenv("NORMBRIDGE_HOME", str(home))
    previous = os.umask(0o022)  # the usual umask, under which the files were world-readable
    try:
        registry = Registry()
        digest = registry.store.put(b"a registered model's weights")
    finally:
        os.umask(previous)
    blob = registry.store.path_of(digest)
    for target in (blob, home / "registry.db", home / "registry.db-wal"):
        assert as_user(NOBODY, read(target)) == errno.EACCES, f"user nobody read {target}"
    assert as_user(NOBODY, lambda: os.listdir(home / "blobs")) == errno.EACCES
    assert as_user(0, read(blob)) == 0  # the control: the same child as the owner reads it
    registry.meta.close()


@needs_root
def test_a_team_sharing_the_home_with_its_group_reads_and_writes_and_nobody_else_reads(reachable, monkeypatch):
    """NORMBRIDGE_SHARED_GROUP=1 under a setgid team folder (2775, as a team sets it up): folders 2770, database 0660,
    blobs 0440, all of the team's group; a member registers blobs and writes the database, an outsider opens nothing."""
    home = reachable / "team"
    home.mkdir()
    os.chown(home, 0, TEAM_GID)
    os.chmod(home, 0o2775)
    monkeypatch.setenv("NORMBRIDGE_HOME", str(home))
    monkeypatch.setenv("NORMBRIDGE_SHARED_GROUP", "1")
    previous = os.umask(0o077)  # the group's bits are given whatever the umask takes
    try:
        registry = Registry()
        digest = registry.store.put(b"the team's model")
        staged = registry.store.stage(b"not published yet")
        assert mode(staged.temporary) == 0o440
        registry.store.discard(staged)
    finally:
        os.umask(previous)
    folders, databases, blobs = registry_files(home)
    for paths, expected in ((folders[1:], 0o2770), (databases, 0o660), (blobs, 0o440)):
        assert {oct(mode(p)) for p in paths} == {oct(expected)}, [str(p) for p in paths]
    assert {os.lstat(p).st_gid for p in (*folders, *databases, *blobs)} == {TEAM_GID}
    blob = registry.store.path_of(digest)

    def member_writes() -> None:
        with open(blob, "rb") as handle:
            assert handle.read() == b"the team's model"
        LocalBlobStore(home / "blobs", file_modes.SHARED_GROUP).put(b"a member's model")
        connection = sqlite3.connect(home / "registry.db")
        connection.execute(
            "BEGIN IMMEDIATE"
        )  # the write lock: the database, its -wal and -shm are the group's to write
        connection.execute("ROLLBACK")
        connection.close()

    assert as_user(MEMBER_UID, member_writes, groups=(TEAM_GID,)) == 0
    assert len(list(registry.store.digests())) == 2
    for target in (blob, home / "registry.db"):
        assert as_user(OUTSIDER_UID, read(target)) == errno.EACCES, f"a user outside the team read {target}"
    registry.meta.close()


def test_a_shared_group_setting_that_is_neither_1_nor_0_is_refused_naming_it(monkeypatch, tmp_path):
    monkeypatch.setenv("NORMBRIDGE_SHARED_GROUP", "group")
    with pytest.raises(RegistryError, match="NORMBRIDGE_SHARED_GROUP is 'group'; expected 1") as refused:
        LocalBlobStore(tmp_path / "blobs")
    assert refused.value.setting == "NORMBRIDGE_SHARED_GROUP" and not (tmp_path / "blobs").exists()
