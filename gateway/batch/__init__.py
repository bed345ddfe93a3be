"""The OpenAI Batch API, served from the fleet's idle capacity (README "Batches"; app wiring in wiring.py)."""
