"""Atomic on-disk folders: how every cache (the index, the converted SmolLM2, the random test
checkpoints) is written so that a reader never sees a half-written or half-deleted copy.

Owns `publish_folder` (fill a temp sibling, fsync, move the old copy aside, rename) and
`write_synced` (a file written and fsynced). Callers decide what "complete" means (a marker
file written last, hashes in a meta file) and what to do with a broken copy (rebuild it).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(folder: Path) -> None:
    """Move a cache folder aside atomically (readers never see it half deleted), then delete it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
    try:
        os.replace(folder, trash / folder.name)
    except FileNotFoundError:
        pass  # another process removed it first
    shutil.rmtree(trash, ignore_errors=True)


def publish_folder(folder: Path, write: Callable[[Path], None], is_complete: Callable[[Path], bool] = Path.exists) -> bool:
    """Atomically put a folder in place: `write(tmp)` fills a temp sibling (its completeness
    marker last), fsync, move any old copy aside, rename. Readers never see a half-written or
    half-deleted folder. If another process published first (our rename fails) and its folder
    `is_complete`, that one is kept and this returns False. Shared by every on-disk cache: the
    index, the converted SmolLM2, the random checkpoints."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        write(tmp)
        _fsync_dir(tmp)
        if folder.exists():
            _remove(folder)  # the stale or corrupt copy being replaced
        try:
            os.rename(tmp, folder)
        except OSError:
            if not is_complete(folder):
                raise
            return False
        _fsync_dir(folder.parent)
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
