"""Where file bodies live: a small interface, and a local directory behind it.

Replicas that share batches share the directory (a volume), or an S3-compatible bucket
(gateway/batch/s3/files.py, the same calls). Both take the same names: relative, `/`-separated, no `.` or
`..` parts (`files/<id>`, `batches/<id>/lines/...`).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol


class FileStoreError(RuntimeError):
    """The store could not do a call (a bucket that refused or stayed unreachable); says which and why."""


class FileStore(Protocol):
    async def put(self, name: str, data: bytes) -> None: ...

    async def get(self, name: str) -> bytes | None: ...

    async def exists(self, name: str) -> bool: ...

    async def delete(self, name: str) -> None:
        """Remove the file; a missing one is no error."""
        ...

    async def close(self) -> None: ...


def check_name(name: str) -> str:
    """The name if a store may hold it: relative, no empty, `.` or `..` parts, no control characters."""
    parts = name.split("/")
    if not name or any(part in ("", ".", "..") for part in parts) or "\\" in name:
        raise ValueError(f"file name `{name}` leaves the store")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ValueError("a file name has a control character")
    return name


class LocalFileStore:
    """Files under one directory; every write lands whole (written aside, then renamed into place). A call
    the filesystem refuses (disk full, permissions) raises `FileStoreError`, as the bucket's do."""

    def __init__(self, directory: str | Path) -> None:
        self.root = Path(directory).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        path = (self.root / check_name(name)).resolve()  # resolved too: a symlink may not lead out
        if self.root not in path.parents:
            raise ValueError(f"file name `{name}` leaves the store")
        return path

    def _put(self, name: str, data: bytes) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        aside = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
        aside.write_bytes(data)
        os.replace(aside, path)

    def _get(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return None

    def _failed(self, call: str, name: str, exc: OSError) -> FileStoreError:
        return FileStoreError(f"{call} `{name}` in {self.root}: {exc.strerror or exc}")

    async def put(self, name: str, data: bytes) -> None:
        try:
            await asyncio.to_thread(self._put, name, data)
        except OSError as exc:
            raise self._failed("writing", name, exc) from exc

    async def get(self, name: str) -> bytes | None:
        try:
            return await asyncio.to_thread(self._get, name)
        except OSError as exc:
            raise self._failed("reading", name, exc) from exc

    async def exists(self, name: str) -> bool:
        return await asyncio.to_thread(self._path(name).is_file)

    async def delete(self, name: str) -> None:
        try:
            await asyncio.to_thread(self._path(name).unlink, missing_ok=True)
        except OSError as exc:
            raise self._failed("deleting", name, exc) from exc

    async def close(self) -> None:
        return None
