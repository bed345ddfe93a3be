"""The OpenAI Batch API, served from the fleet's idle capacity (docs/batches.md; app wiring in wiring.py)."""
