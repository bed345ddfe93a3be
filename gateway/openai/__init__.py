"""OpenAI wire types: what the gateway reads from requests and responses, kept out of the core."""
