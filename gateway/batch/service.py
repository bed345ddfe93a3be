"""What the batch API and the scheduler share: options, state, file store, and the batch's key."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from backends.catalog import Catalog
from gateway.batch.files import FileStore, LocalFileStore
from gateway.batch.memory_state import MemoryBatchState
from gateway.batch.objects import StoredBatch
from gateway.batch.redis_state import RedisBatchState
from gateway.batch.s3.files import S3FileStore, credentials_from_env
from gateway.batch.state import BatchState
from gateway.config.batches import BatchOptions
from gateway.config.settings import Settings
from gateway.redis.client import redis_client
from gateway.request.pipeline import Pipeline
from gateway.tenants.admission import Tenant, Tenants


@dataclass
class BatchService:
    options: BatchOptions
    state: BatchState
    files: FileStore
    pipeline: Pipeline
    catalog: Catalog
    """The backends the lines are placed on (the pipeline's)."""
    tenants: Tenants | None
    """The keys the batches run as (the pipeline's); None in open mode."""
    replica: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
    )

    @property
    def keys_mode(self) -> bool:
        tenants = self.tenants
        return tenants is not None and tenants.options.mode == "keys"

    async def tenant_of(self, stored: StoredBatch) -> Tenant | None:
        """The key a batch's lines run as, as it is now (keys mode); None in open mode. Raises 401
        `key_revoked` / `key_expired` / `key_not_found` (the batch stops) or 503 `limits_unavailable`
        (its lines wait): a line is never sent without its key."""
        tenants = self.tenants
        if not self.keys_mode or tenants is None:
            return None
        return await tenants.resolve(stored.owner)


def build_batches(
    settings: Settings, pipeline: Pipeline, catalog: Catalog, tenants: Tenants | None
) -> BatchService | None:
    options: BatchOptions = settings.batches
    if not options.enabled:
        return None
    state: BatchState
    url = settings.ledger.redis_url
    if options.store == "redis" or (options.store == "auto" and url):
        if not url:
            raise ValueError("batches.store is redis but ledger.redis_url is not set")
        client = redis_client(url, socket_connect_timeout=2.0, socket_timeout=5.0)
        state = RedisBatchState(client, settings.ledger.key_prefix)
    else:
        state = MemoryBatchState()
    return BatchService(options, state, _file_store(settings), pipeline, catalog, tenants)


def _file_store(settings: Settings) -> FileStore:
    """The bucket `batches.s3` names, else the directory `batches.directory` (relative to the config)."""
    options: BatchOptions = settings.batches
    if options.s3 is not None:
        return S3FileStore(options.s3, credentials_from_env(options.s3))
    directory = options.directory
    if not os.path.isabs(directory) and not settings.source.startswith("<"):
        directory = os.path.join(os.path.dirname(os.path.abspath(settings.source)), directory)
    return LocalFileStore(directory)
