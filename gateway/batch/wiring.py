"""Wiring the batch API into the app: its routes and the scheduler that lives as long as the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.handlers import BaseRouteHandler

from gateway.batch.api import batch_handlers as batch_routes
from gateway.batch.files_api import file_handlers
from gateway.batch.runner import BatchRunner
from gateway.batch.service import BatchService, build_batches

__all__ = ["batch_handlers", "batch_lifespan", "build_batches"]


def batch_handlers(service: BatchService) -> list[BaseRouteHandler]:
    """`/v1/files` and `/v1/batches`."""
    return [*file_handlers(service), *batch_routes(service)]


def batch_lifespan(service: BatchService):
    @asynccontextmanager
    async def run(app: Litestar) -> AsyncIterator[None]:
        runner = BatchRunner(service)
        runner.start()
        app.state.batch_runner = runner
        try:
            yield
        finally:
            await runner.stop()
            await service.state.close()
            await service.files.close()

    return run
