"""The request path, one module a step: parse → classify → route → forward → account (pipeline.py)."""
