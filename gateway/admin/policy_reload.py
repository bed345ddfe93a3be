"""Hot reload of the routing policy: a valid change applies to new requests, an invalid one is refused.

The file's modification time and size are polled off the event loop (no watcher dependency; works on
every filesystem and with editors that replace the file). In-flight requests keep the decision they
already have; the swap is one attribute assignment on the pipeline. The engine installed is the one that
validated the file (`load_engine`); a file saved again unchanged builds nothing. A deleted file is
reported (log and `last_error`) while the last good policy keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from backends.catalog import Catalog
from backends.yamlfile import ConfigError
from gateway.request.pipeline import Pipeline
from policies.config import policy_version
from policies.engine import PolicyEngine, load_engine

log = logging.getLogger("switchyard.policy")

SETTLE_S = 0.05
"""A changed file is read only after it has held still this long, and only if it still has: a writer that
truncates then writes (`open(path, "w")`, many editors' save in place) leaves it empty or half written
for a moment, and a read there would refuse a policy nobody wrote. The next poll reads it whole."""


def _stamp(path: Path) -> tuple[int, int, int, int] | None:
    """What identifies the file's content; the inode catches Kubernetes' ConfigMap update (a symlink swap
    to a new file), which may keep the size and, on coarse-timestamp filesystems, the mtime."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size


class PolicyWatcher:
    def __init__(self, path: Path, pipeline: Pipeline, catalog: Catalog, interval: float) -> None:
        self.path = path
        self._pipeline = pipeline
        self._catalog = catalog
        self._interval = interval
        self._stamp = _stamp(path)
        self._task: asyncio.Task[None] | None = None
        self.reloads = 0
        self.rejected = 0
        self.last_error: str | None = None

    def check(self) -> bool:
        """Reload if the file changed; True when a new policy was applied. Blocks for `SETTLE_S` when the
        file changed (it runs off the event loop)."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        if stamp is None:
            self._stamp = stamp
            self._gone()
            return False
        self._settle()
        try:
            text: str | OSError = self.path.read_text(errors="replace")
        except OSError as exc:
            text = exc
        if _stamp(self.path) != stamp:
            return False  # still being written (or replaced): the next poll reads what it becomes
        self._stamp = stamp
        running = self._pipeline.router
        try:
            if isinstance(text, OSError):
                raise text
            version = policy_version(text)
            if isinstance(running, PolicyEngine) and running.version == version:
                self.last_error = None  # back as it was (say, after a delete): nothing to build
                return False
            engine = load_engine(self.path, self._catalog.backends)
        except (ConfigError, OSError) as exc:
            self.rejected += 1
            self.last_error = str(exc)
            log.error("policy change refused, keeping the last good policy: %s", exc)
            return False
        self._pipeline.router = engine
        self.reloads += 1
        self.last_error = None
        log.info("policy reloaded from %s: %s (version %s)", self.path, engine.name, engine.version)
        for warning in engine.warnings:
            log.warning("policy: %s", warning)
        return True

    def _settle(self) -> None:
        time.sleep(SETTLE_S)

    def _gone(self) -> None:
        serving = self._pipeline.router.name
        self.last_error = f"{self.path}: the policy file is gone; serving the last good policy `{serving}`"
        log.warning("%s; restore the file to change the policy again", self.last_error)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await asyncio.to_thread(self.check)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="switchyard-policy-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
