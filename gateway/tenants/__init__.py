"""Tenants: API keys, teams, shared rate limits and dollar budgets (docs/keys.md).

The request path calls three things, all in `admission.py`: `Tenants.authenticate` at the edge,
`Tenants.admit` once the request is routed, and `Admission.settle` once from the request's end.
"""
