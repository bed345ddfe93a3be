"""The gateway's one config file: server options plus the pools it routes to. Read when the app is created."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from backends.breaker import BreakerOptions
from backends.health import CheckPlan
from backends.models import Backend, PoolConfig, build_backends
from backends.yamlfile import ConfigError, decode, parse_yaml, read_text
from gateway.config.batches import BatchOptions
from gateway.config.ledger import LedgerOptions
from gateway.config.networks import parse_network
from gateway.config.request_bounds import RequestLimits
from gateway.config.responses import ResponsesOptions
from gateway.redis.client import URL_PATTERN as REDIS_URL_PATTERN
from gateway.redis.client import parse_redis_url
from policies import presets
from policies.engine import PolicyEngine, load_engine

log = logging.getLogger("switchyard.policy")

_Seconds = Annotated[float, msgspec.Meta(gt=0)]


class Timeouts(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Upstream timeouts: connecting, waiting for the first byte (a stream's first token), the longest gap
    between chunks, and (optional) the whole request. A route of the policy may override each."""

    connect: _Seconds = 3.0
    first_byte: _Seconds = 120.0
    between_chunks: _Seconds = 60.0
    total: _Seconds | None = None


class PoolHealth(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """One pool's health-check overrides; what is not given comes from `gateway.health`."""

    interval: _Seconds | None = None
    timeout: _Seconds | None = None
    unhealthy_after: Annotated[int, msgspec.Meta(ge=1)] | None = None
    healthy_after: Annotated[int, msgspec.Meta(ge=1)] | None = None


class HealthChecks(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    interval: _Seconds = 5.0
    timeout: _Seconds = 2.0
    unhealthy_after: Annotated[int, msgspec.Meta(ge=1)] = 2
    """Failed checks in a row that take a backend out of routing."""
    healthy_after: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Passing checks in a row that put it back."""
    pools: dict[str, PoolHealth] = {}
    """Per-pool overrides, by pool name."""

    def plan(self, pool: str | None = None) -> CheckPlan:
        o = self.pools.get(pool) if pool is not None else None
        return CheckPlan(
            interval=(o and o.interval) or self.interval,
            timeout=(o and o.timeout) or self.timeout,
            unhealthy_after=(o and o.unhealthy_after) or self.unhealthy_after,
            healthy_after=(o and o.healthy_after) or self.healthy_after,
        )


class Retries(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Retrying a request on another backend before its first byte reaches the client."""

    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=10)] = 3
    """Backends one request may be sent to (1 = never retry)."""
    budget_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
    """Gateway-wide: retries may add at most this fraction of requests (token bucket)..."""
    budget_burst: Annotated[float, msgspec.Meta(ge=0)] = 20.0
    """...plus a burst of this many, so a quiet gateway still retries."""
    backoff_ms: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    """Base of the exponential backoff before a retry; the wait is uniform in [0, base x 2^(n-1)]."""
    backoff_max_ms: Annotated[float, msgspec.Meta(ge=0)] = 250.0


class Scrape(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Reading each backend's vLLM /metrics (queue, running batch, KV-cache usage) for routing."""

    interval: _Seconds = 1.0
    timeout: _Seconds = 1.0


class PolicyOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    file: Annotated[str, msgspec.Meta(min_length=1)] = "balanced"
    """A preset's name (balanced, latency-first, capacity-first, cheapest) or a policy file's path,
    relative to this config file."""
    reload_interval: _Seconds = 1.0
    """How often the policy file is checked for changes; a valid change applies to new requests."""
    clock_scale: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    """Backend seconds per second of the gateway's clock. 1 for real backends. A load test's simulated
    fleet runs `time_scale` times faster than real time and writes that here, so the latencies routing
    learns from (observe()) and compares with the policy's SLOs, and the back-pressure wait, are on
    the fleet's clock."""


_Count = Annotated[int, msgspec.Meta(ge=1)]


class ConnectionLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What one client connection may do (gateway/http/limits.py); a connection past a timeout is closed."""

    header_timeout: _Seconds = 10.0
    """From a request's first byte to the end of its headers (slowloris); then 408."""
    body_timeout: _Seconds = 60.0
    """From the end of the headers to the end of the body (slow bodies); then 408."""
    keep_alive_timeout: _Seconds = 5.0
    """An idle connection (new, or between requests) is closed after this long."""
    max_total: _Count = 10_000
    """Open client connections in all; past it a new one gets 503 and is closed."""
    max_per_client: _Count = 256
    """Open connections from one client address; past it a new one gets 429 and is closed."""
    max_header_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 65_536
    """Request line plus all headers; past it 431."""
    max_header_value_bytes: Annotated[int, msgspec.Meta(ge=256)] = 8_190
    """One header's value (8190 is what vLLM's server accepts); past it 431."""


class ServerOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 8 * 1024 * 1024
    max_connections_per_backend: Annotated[int, msgspec.Meta(ge=1)] = 4096
    """Open connections to one backend. Past vLLM's seats (`max_num_seqs`, 1,024 by default on H100 and
    MI300X, 256 on smaller GPUs) a request must wait in the backend's queue, where its metrics
    (`num_requests_waiting`) show the router the queue; one held here for a connection is invisible to
    routing, which then keeps piling work onto that backend."""
    timeouts: Timeouts = msgspec.field(default_factory=Timeouts)
    health: HealthChecks = msgspec.field(default_factory=HealthChecks)
    breaker: BreakerOptions = msgspec.field(default_factory=BreakerOptions)
    retries: Retries = msgspec.field(default_factory=Retries)
    scrape: Scrape = msgspec.field(default_factory=Scrape)
    admin_port: Annotated[int, msgspec.Meta(ge=0, le=65535)] | None = None
    """Serve `/admin/...` on this port only (the main port then answers 404 there)."""
    limits: RequestLimits = msgspec.field(default_factory=RequestLimits)
    connections: ConnectionLimits = msgspec.field(default_factory=ConnectionLimits)
    shutdown_grace: _Seconds = 30.0
    """On SIGTERM: stop accepting, let in-flight requests finish for up to this long, flush the ledger."""
    workers: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    """Gateway processes on one port (gateway/serve/workers.py), sharing state as replicas do."""
    worker_balance: Literal["least_connections", "reuseport"] = "least_connections"
    """How `workers` share connections: the supervisor accepts and hands each to the worker with the
    fewest open ones, or each worker listens with SO_REUSEPORT and the kernel picks by a hash (no
    per-connection cost in the supervisor; uneven with few connections)."""
    trusted_proxies: list[str] = []
    """Balancers (CIDRs, or single addresses) whose word on the client's address is taken: a PROXY header
    (`proxy_protocol`) or X-Forwarded-For (`forwarded_for`). From any other address neither is honoured."""
    proxy_protocol: Literal["off", "optional", "required"] = "optional"
    """A trusted balancer's connection may (`optional`) or must (`required`) begin with a PROXY v1/v2
    header naming the client; `off`: never read one. Untrusted peers never get one read."""
    forwarded_for: bool = False
    """On a trusted balancer's connection without a PROXY header, X-Forwarded-For names each request's
    client (the per-client cap then counts that client's requests in flight)."""


class Tracing(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """OpenTelemetry traces: one span per request, children per step (gateway/telemetry/tracing.py)."""

    enabled: bool = False
    exporter: Literal["otlp", "none"] = "otlp"
    """`none` builds every span and drops it (benchmarks: the cost of tracing without a collector).
    Either way spans are built and exported by a child process, off the gateway's event loop."""
    endpoint: Annotated[str, msgspec.Meta(pattern=r"^https?://")] = "http://127.0.0.1:4318/v1/traces"
    protocol: Literal["http/protobuf", "grpc"] = "http/protobuf"
    """`grpc` needs `opentelemetry-exporter-otlp-proto-grpc` installed (and an endpoint like :4317)."""
    headers: dict[str, str] = {}
    service_name: Annotated[str, msgspec.Meta(min_length=1)] = "switchyard"
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    """Of requests without an incoming sampled `traceparent` (an incoming one's decision is kept)."""
    max_queue: Annotated[int, msgspec.Meta(ge=1)] = 20_000
    """Finished traces waiting to be shipped; past it new ones are dropped and counted."""


class AccessLog(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One JSON line per request (gateway/telemetry/logs.py)."""

    enabled: bool = True
    destination: Annotated[str, msgspec.Meta(min_length=1)] = "stdout"
    """`stdout`, `stderr` or a file path (appended to)."""
    include_prompts: bool = False
    """Also log the request body. Off by default: prompts are user data."""


class TelemetryOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    metrics: bool = True
    """`GET /metrics` in Prometheus text format."""
    tracing: Tracing = msgspec.field(default_factory=Tracing)
    access_log: AccessLog = msgspec.field(default_factory=AccessLog)


class AuthOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """API keys, rate limits and budgets (gateway/tenants/, docs/keys.md)."""

    mode: Literal["keys", "open"] = "open"
    """`keys`: every request needs a key (`sy-...`); `open`: anyone may call (the demo, tests)."""
    admin_key_env: Annotated[str, msgspec.Meta(min_length=1)] = "SWITCHYARD_ADMIN_KEY"
    """Environment variable holding the bootstrap admin key (read at start; may be unset)."""
    allow_weak_admin_key: bool = False
    """Start even with a weak admin key (gateway/tenants/admin_key.py says which are), with a warning."""
    store: Literal["auto", "redis", "memory"] = "auto"
    """`auto`: Redis when `redis_url` (or `ledger.redis_url`) is set, else memory (one replica)."""
    redis_url: Annotated[str, msgspec.Meta(pattern=REDIS_URL_PATTERN)] | None = None
    """Defaults to `ledger.redis_url`; the key prefix is `ledger.key_prefix`."""
    window_s: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 60
    """The rate-limit window: `rpm` and `tpm` count requests and tokens per this many seconds."""
    redis_away: Literal["fail_open", "fail_closed"] = "fail_open"
    """Redis unreachable: `fail_open` enforces each rate limit from a local share (limit / replicas) and
    refuses only keys with a budget; `fail_closed` answers 503 `limits_unavailable`."""
    replicas: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Replicas sharing the limits: each one's share while Redis is away."""
    refresh_interval: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.25
    """How often each replica checks for changed keys (revocations reach it within this)."""
    redis_timeout: _Seconds = 0.5
    public_key_metrics: bool = False
    """`/metrics` on the public port with the per-key and per-team budget series too; off, only the admin
    port (`gateway.admin_port`) shows them (they name every budgeted key)."""


class ConfigFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pools: Annotated[list[PoolConfig], msgspec.Meta(min_length=1)]
    policy: PolicyOptions = msgspec.field(default_factory=PolicyOptions)
    gateway: ServerOptions = msgspec.field(default_factory=ServerOptions)
    ledger: LedgerOptions = msgspec.field(default_factory=LedgerOptions)
    telemetry: TelemetryOptions = msgspec.field(default_factory=TelemetryOptions)
    auth: AuthOptions = msgspec.field(default_factory=AuthOptions)
    batches: BatchOptions = msgspec.field(default_factory=BatchOptions)
    responses: ResponsesOptions = msgspec.field(default_factory=ResponsesOptions)


class Settings(msgspec.Struct, kw_only=True):
    """Validated settings plus the run-time backends they describe."""

    source: str
    server: ServerOptions
    pools: list[PoolConfig]
    backends: list[Backend]
    ledger: LedgerOptions = msgspec.field(default_factory=LedgerOptions)
    policy_options: PolicyOptions = msgspec.field(default_factory=PolicyOptions)
    policy: PolicyEngine | None = None
    """The routing policy, built (so validated) against these backends: the engine the gateway runs.
    None only for settings built in code."""
    telemetry: TelemetryOptions = msgspec.field(default_factory=TelemetryOptions)
    auth: AuthOptions = msgspec.field(default_factory=AuthOptions)
    batches: BatchOptions = msgspec.field(default_factory=BatchOptions)
    responses: ResponsesOptions = msgspec.field(default_factory=ResponsesOptions)

    @property
    def models(self) -> list[str]:
        return sorted({model for backend in self.backends for model in backend.models})


def _check_trusted_proxies(gateway: ServerOptions, lines: dict[tuple[Any, ...], int], source: str) -> None:
    for i, text in enumerate(gateway.trusted_proxies):
        try:
            parse_network(text)
        except ValueError as exc:
            line = lines.get(("gateway", "trusted_proxies", i), lines.get(("gateway", "trusted_proxies")))
            raise ConfigError(
                source,
                line,
                f"gateway.trusted_proxies[{i}]: `{text}` is not an address or CIDR ({exc})",
                hint="e.g. 10.0.0.0/8 or 127.0.0.1",
            ) from None
    if not gateway.trusted_proxies:
        for key, set_to in (
            ("proxy_protocol", gateway.proxy_protocol == "required"),
            ("forwarded_for", gateway.forwarded_for),
        ):
            if set_to:
                raise ConfigError(
                    source,
                    lines.get(("gateway", key)),
                    f"gateway.{key} is honoured only from gateway.trusted_proxies, which is empty",
                    hint="list the balancers' addresses in gateway.trusted_proxies",
                )


def _check_semantics(config: ConfigFile, lines: dict[tuple[Any, ...], int], source: str) -> None:
    _check_trusted_proxies(config.gateway, lines, source)
    seen_pools: set[str] = set()
    seen_backends: dict[str, tuple[Any, ...]] = {}
    for p, pool in enumerate(config.pools):
        if pool.name in seen_pools:
            raise ConfigError(
                source, lines.get(("pools", p, "name")), f"pool name `{pool.name}` is used twice"
            )
        seen_pools.add(pool.name)
        for b, backend in enumerate(pool.backends):
            path = ("pools", p, "backends", b)
            name = backend.name or f"{pool.name}-{b}"
            if name in seen_backends:
                line = lines.get((*path, "name"), lines.get(path))
                raise ConfigError(source, line, f"backend name `{name}` is used twice")
            seen_backends[name] = path
            if backend.api_key_env and backend.api_key_env not in os.environ:
                raise ConfigError(
                    source,
                    lines.get((*path, "api_key_env")),
                    f"environment variable `{backend.api_key_env}` is not set",
                    hint="export it before starting the gateway, or remove api_key_env",
                )


def load_settings(path: str | Path) -> Settings:
    """Read and validate the config file; raises ConfigError naming the file and line."""
    return settings_from_text(read_text(path, "config file"), str(path))


def policy_path(options: PolicyOptions, config_source: str) -> Path:
    folder = Path(config_source).parent if not config_source.startswith("<") else Path.cwd()
    return presets.resolve(options.file, folder)


def _load_policy(
    config: ConfigFile, backends: list[Backend], lines: dict[tuple[Any, ...], int], source: str
) -> PolicyEngine:
    path = policy_path(config.policy, source)
    if not path.is_file():
        known = ", ".join(presets.preset_names())
        raise ConfigError(
            source,
            lines.get(("policy", "file")),
            f"policy `{config.policy.file}` is neither a preset nor a file ({path})",
            hint=f"presets: {known}",
        )
    engine = load_engine(path, backends)
    for warning in engine.warnings:
        log.warning("policy: %s", warning)
    return engine


def settings_from_text(text: str, source: str = "<config>") -> Settings:
    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(source, lines.get((), 1), "the config file must be a mapping with a `pools` list")
    config = decode(data, lines, ConfigFile, source)
    _check_semantics(config, lines, source)
    for pool_name in config.gateway.health.pools:
        if pool_name not in {p.name for p in config.pools}:
            line = lines.get(("gateway", "health", "pools", pool_name))
            raise ConfigError(source, line, f"gateway.health.pools names an unknown pool `{pool_name}`")
    if config.ledger.store == "redis" and not config.ledger.redis_url:
        raise ConfigError(source, lines.get(("ledger", "store")), "ledger.store is redis but no redis_url")
    if config.responses.store == "redis" and not config.ledger.redis_url:
        where = lines.get(("responses", "store"))
        raise ConfigError(source, where, "responses.store is redis but ledger.redis_url is not set")
    for section, url in (("ledger", config.ledger.redis_url), ("auth", config.auth.redis_url)):
        try:
            parse_redis_url(url or "")
        except ValueError as exc:
            raise ConfigError(
                source, lines.get((section, "redis_url")), f"{section}.redis_url: {exc}"
            ) from None
    s3 = config.batches.s3
    unset = s3.unset_key_variable(os.environ) if config.batches.enabled and s3 is not None else None
    if unset is not None:
        raise ConfigError(
            source,
            lines.get(("batches", "s3", unset), lines.get(("batches", "s3"))),
            f"batches.s3.{unset}: environment variable `{getattr(s3, unset)}` is not set",
            hint="export the bucket's access key before starting the gateway",
        )
    backends = build_backends(config.pools, breaker=config.gateway.breaker)
    return Settings(
        source=source,
        server=config.gateway,
        pools=config.pools,
        backends=backends,
        ledger=config.ledger,
        policy_options=config.policy,
        policy=_load_policy(config, backends, lines, source),
        telemetry=config.telemetry,
        auth=config.auth,
        batches=config.batches,
        responses=config.responses,
    )
