"""The Responses API's stored responses, kept by the gateway (docs/api.md says why)."""
