"""`GET /admin/v1/costs?by=...&window=...[&format=text]`: the cost table, from the ledger.

JSON: `{"by", "window", "rows": [CostRow...], "ledger": stats}`; `format=text` answers the table that
`switchyard costs` prints (both use `format_cost_table`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from litestar import Request, Response, get
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromQuery

from gateway.errors import invalid_request
from gateway.ledger.costs import WINDOWS, format_cost_table
from gateway.ledger.records import DIMENSIONS, Dimension, Ledger
from gateway.tenants.admin import visible_rows


def costs_handler(ledger: Ledger) -> HTTPRouteHandler:
    @get("/admin/v1/costs", name="costs")
    async def costs(
        request: Request[Any, Any, Any],
        by: FromQuery[str] = "backend",
        window: FromQuery[str] = "15m",
        format: FromQuery[str] = "json",
    ) -> Response[Any]:
        if by not in DIMENSIONS:
            raise invalid_request(f"`by` must be one of {', '.join(DIMENSIONS)}.", param="by")
        if window not in WINDOWS:
            raise invalid_request(f"`window` must be one of {', '.join(WINDOWS)}.", param="window")
        if format not in ("json", "text"):
            raise invalid_request("`format` must be json or text.", param="format")
        dimension: Dimension = by  # type: ignore[assignment]
        rows = visible_rows(request, [asdict(row) for row in await ledger.costs(dimension, window)])
        if format == "text":
            return Response(format_cost_table(by, window, rows) + "\n", media_type="text/plain")
        return Response({"by": by, "window": window, "rows": rows, "ledger": ledger.stats()})

    return costs
