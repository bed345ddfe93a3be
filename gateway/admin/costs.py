"""`GET /admin/v1/costs?by=...&window=...[&format=text]`: the cost table, from the ledger.

JSON: `{"by", "window", "idle_cost", "totals": {paid_nusd, allocated_nusd, idle_nusd}, "rows": [CostRow...],
"ledger": stats}`; `format=text` answers the
table that `switchyard costs` prints (both use `format_cost_table`). Rows show paid, allocated and idle
cost apart (gateway/ledger/allocation.py); `idle_cost` says whether idle cost is shown apart (`idle`) or
spread over the requests (`spread`).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from litestar import Controller, Request, Response, get
from litestar.params import FromQuery

from gateway.admin.keys import visible_rows
from gateway.http.controllers import per_app
from gateway.ledger.costs import WINDOWS, format_cost_table
from gateway.ledger.records import DIMENSIONS, Dimension, Ledger
from gateway.openai.errors import invalid_request


class CostsController(Controller):
    """`GET /admin/v1/costs` over the app's ledger."""

    path = "/admin/v1/costs"
    ledger: Ledger

    @get("/", name="costs")
    async def costs(
        self,
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
        dimension: Dimension = by
        cost_rows, totals = await self.ledger.report(dimension, window)
        every_row = [asdict(row) for row in cost_rows]
        rows = visible_rows(request, every_row)
        if rows is not every_row:  # a tenant sees its own rows, not the fleet's totals
            totals = {}
        idle_cost = self.ledger.idle_cost
        if format == "text":
            return Response(format_cost_table(by, window, rows, idle_cost) + "\n", media_type="text/plain")
        body = {
            "by": by,
            "window": window,
            "idle_cost": idle_cost,
            "totals": totals,
            "rows": rows,
            "ledger": self.ledger.stats(),
        }
        return Response(body)


def costs_controller(ledger: Ledger) -> type[CostsController]:
    return per_app(CostsController, ledger=ledger)
