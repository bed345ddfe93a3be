"""Where file bodies live: a small interface, and a local directory behind it.

Replicas that share batches share the directory (a volume). An S3-compatible store would implement the
same three calls; it is not built yet (README "Batches").
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol


class FileStore(Protocol):
    async def put(self, name: str, data: bytes) -> None: ...

    async def get(self, name: str) -> bytes | None: ...

    async def exists(self, name: str) -> bool: ...


class LocalFileStore:
    """Files under one directory; every write lands whole (written aside, then renamed into place)."""

    def __init__(self, directory: str | Path) -> None:
        self.root = Path(directory).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        path = (self.root / name).resolve()
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

    async def put(self, name: str, data: bytes) -> None:
        await asyncio.to_thread(self._put, name, data)

    async def get(self, name: str) -> bytes | None:
        return await asyncio.to_thread(self._get, name)

    async def exists(self, name: str) -> bool:
        return await asyncio.to_thread(self._path(name).is_file)
