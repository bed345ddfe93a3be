"""Wiring the batch API into the app: its routes and the scheduler that lives as long as the app."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Controller, Litestar

from gateway.batch.api import batches_controller
from gateway.batch.files_api import files_controller
from gateway.batch.runner import BatchRunner
from gateway.batch.service import BatchService, build_batches
from gateway.stopping import stop_step

__all__ = ["batch_controllers", "batch_lifespan", "build_batches"]


def batch_controllers(service: BatchService) -> list[type[Controller]]:
    """`/v1/files` and `/v1/batches`, over the app's batch service."""
    return [files_controller(service), batches_controller(service)]


def batch_lifespan(service: BatchService):
    @asynccontextmanager
    async def run(app: Litestar) -> AsyncIterator[None]:
        runner = BatchRunner(service)
        runner.start()
        app.state.batch_runner = runner
        try:
            yield
        finally:
            await stop_step("the batch runner", runner.stop())
            await stop_step("the batch store", service.state.close())
            await stop_step("the file store", service.files.close())

    return run
