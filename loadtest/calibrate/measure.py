"""Talking to a live vLLM server: streamed completions of exact token counts, and its /metrics.

Prompts are token ids (the completions API takes them), drawn from ids the server's own `/tokenize`
returned, so a prompt has exactly the size asked for on the server and on the simulator alike. Each
request asks for a fixed output (`ignore_eos`), streams, and is timed by the client: time to the first
token, and the mean gap between tokens after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import statistics
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
import httpx

SEED_TEXT = (
    "The gateway routes each request to a pool of servers; every server batches the requests it holds and "
    "decodes one token for each of them per step, reading the weights and the cache once per step. "
    "Prefill runs the prompt through the model in chunks, which costs compute rather than bandwidth."
)
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')


class ServerError(RuntimeError):
    """The server refused or broke a request the calibration needs (the message says which)."""


@dataclass(slots=True)
class Timed:
    """One request as the client saw it."""

    prompt_tokens: int
    output_tokens: int
    sent_at: float
    ttft_s: float
    tpot_s: float | None
    """Mean gap between tokens after the first; None for a one-token output."""
    e2e_s: float


def after_opening(timed: list[Timed], concurrency: int) -> list[Timed]:
    """A closed loop's requests after its opening cohort (the first request of each of its `concurrency`
    clients, sent together): where newcomers arrive one by one among running streams."""
    return sorted(timed, key=lambda t: t.sent_at)[concurrency:]


class Send(Protocol):
    async def __call__(self, prompt: list[int], output_tokens: int) -> Timed: ...


@dataclass(slots=True)
class Metrics:
    """One scrape of /metrics: every series summed over its labels, plus the info series' labels."""

    values: dict[str, float]
    info: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, name: str) -> float:
        return self.values.get(name, 0.0)


def parse_metrics(text: str) -> Metrics:
    values: dict[str, float] = {}
    info: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, raw = line.rpartition(" ")
        name = series.split("{", 1)[0]
        try:
            value = float(raw)
        except ValueError:
            continue
        if name.endswith("_info"):
            info[name] = dict(LABEL_RE.findall(series))
        if name.endswith("_bucket"):
            continue
        values[name] = values.get(name, 0.0) + value
    return Metrics(values, info)


def histogram_mean(before: Metrics, after: Metrics, name: str) -> tuple[float, int]:
    """The mean of what a histogram observed between two scrapes, and how many observations."""
    count = after.get(name + "_count") - before.get(name + "_count")
    total = after.get(name + "_sum") - before.get(name + "_sum")
    return (total / count if count > 0 else 0.0), int(count)


class Server:
    """An OpenAI-compatible vLLM server under measurement."""

    def __init__(self, url: str, model: str, timeout: float = 120.0, through: str | None = None) -> None:
        """`through`: where the timed requests go, when not to `url` itself (a gateway in front of it);
        /metrics, /tokenize and /v1/models are always asked of `url`."""
        self.url = url.rstrip("/")
        self.send_url = (through or url).rstrip("/")
        self.model = model
        self.client = httpx.AsyncClient(
            timeout=timeout, trust_env=False, limits=httpx.Limits(max_connections=None)
        )
        self.timeout = timeout
        self._streams: aiohttp.ClientSession | None = None
        self.vocabulary: list[int] = []

    async def close(self) -> None:
        await self.client.aclose()
        if self._streams is not None:
            await self._streams.close()

    @property
    def streams(self) -> aiohttp.ClientSession:
        """The timed requests' client (`stream_client`), made on first use (inside the event loop)."""
        if self._streams is None:
            self._streams = stream_client(self.timeout)
        return self._streams

    async def metrics(self) -> Metrics:
        r = await self.client.get(self.url + "/metrics")
        if r.status_code != 200:
            raise ServerError(f"GET {self.url}/metrics answered {r.status_code}")
        return parse_metrics(r.text)

    async def only_model(self) -> str:
        """The model the server serves, when it serves exactly one (GET /v1/models)."""
        r = await self.client.get(self.url + "/v1/models")
        if r.status_code != 200:
            raise ServerError(f"GET {self.url}/v1/models answered {r.status_code}")
        names = [str(entry.get("id")) for entry in r.json().get("data", [])]
        if len(names) != 1:
            served = ", ".join(names)
            raise ServerError(f"{self.url} serves {len(names)} models ({served}); pick one with --model")
        return names[0]

    async def max_model_len(self) -> int:
        r = await self.client.get(self.url + "/v1/models")
        if r.status_code != 200:
            raise ServerError(f"GET {self.url}/v1/models answered {r.status_code}")
        for entry in r.json().get("data", []):
            if entry.get("id") == self.model and isinstance(entry.get("max_model_len"), int):
                return int(entry["max_model_len"])
        raise ServerError(f"{self.url} does not serve model `{self.model}` (GET /v1/models)")

    async def version(self) -> str:
        """vLLM's version (/version), or "" when it does not say."""
        with contextlib.suppress(Exception):
            r = await self.client.get(self.url + "/version")
            if r.status_code == 200:
                return str(r.json().get("version", ""))
        return ""

    async def round_trip(self, tries: int = 16) -> float:
        """The median time of a bare request (`GET /health` of the server): what the client and HTTP cost
        alone (the timed requests' client, `streams`)."""
        times = []
        for _ in range(tries):
            sent = time.perf_counter()
            async with self.streams.get(self.url + "/health") as r:
                await r.read()
                times.append(time.perf_counter() - sent)
                if r.status != 200:
                    raise ServerError(f"GET {self.url}/health answered {r.status}")
        return statistics.median(times)

    async def gateway_hop(self, rng: random.Random, pairs: int = 16) -> float:
        """What the gateway in front (`through`) adds to a request it forwards, 0 without one: the median
        over `pairs` of a one-token answer's time to its token through the gateway less the same-sized
        request's sent directly, in turns (fresh prompt tokens each time, each pair's order alternating).
        A simulator's client pays that hop itself, so the profile's front end must not hold it too."""
        if self.send_url == self.url:
            return 0.0
        gaps = []
        for index in range(pairs):
            via, direct = self.prompt(8, rng), self.prompt(8, rng)
            order = [(self.send_url, via), (self.url, direct)]
            if index % 2:
                order.reverse()
            timed = {url: await self._first_token(url, prompt) for url, prompt in order}
            gaps.append(timed[self.send_url] - timed[self.url])
        return max(0.0, statistics.median(gaps))

    async def _first_token(self, url: str, prompt: list[int]) -> float:
        return (await stream_completion(self.streams, url, self.model, prompt, 1)).ttft_s

    async def learn_vocabulary(self) -> None:
        """Token ids to build prompts from: what /tokenize makes of a plain paragraph."""
        r = await self.client.post(
            self.url + "/tokenize",
            json={"model": self.model, "prompt": SEED_TEXT, "add_special_tokens": False},
        )
        if r.status_code != 200:
            raise ServerError(f"POST {self.url}/tokenize answered {r.status_code}: {r.text[:200]}")
        ids = sorted(set(r.json().get("tokens", [])))
        if len(ids) < 8:
            raise ServerError(f"{self.url}/tokenize gave too few tokens to build prompts from")
        self.vocabulary = ids

    def prompt(self, tokens: int, rng: random.Random) -> list[int]:
        return [rng.choice(self.vocabulary) for _ in range(tokens)]

    async def count(self, prompt: list[int]) -> int:
        """What the server counts for a prompt (its exact size)."""
        r = await self.client.post(self.url + "/tokenize", json={"model": self.model, "prompt": prompt})
        if r.status_code != 200:
            raise ServerError(f"POST {self.url}/tokenize answered {r.status_code}: {r.text[:200]}")
        return int(r.json()["count"])

    async def complete(self, prompt: list[int], output_tokens: int) -> Timed:
        """One timed request; a broken connection is retried (twice) rather than ending the sweep."""
        for attempt in range(3):
            try:
                return await stream_completion(self.streams, self.send_url, self.model, prompt, output_tokens)
            except aiohttp.ClientConnectionError:
                if attempt == 2:
                    raise
                await asyncio.sleep(0.2)
        raise AssertionError("unreachable")


def stream_client(timeout: float = 120.0) -> aiohttp.ClientSession:
    """The client that sends and times the streamed requests: aiohttp, whose C parser costs a third of
    httpx's CPU per streamed token. On a machine the server shares (the CPU proof), the measuring client
    competes with the server's API process for a core: with httpx, twelve streams took 41 % of a core
    and doubled the server's TTFT at that load (docs/calibrate.md). Must be made inside the event loop."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=timeout)
    )


async def stream_completion(
    client: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: list[int],
    output_tokens: int,
    headers: dict[str, str] | None = None,
) -> Timed:
    """One streamed completion of exactly `output_tokens` tokens, timed by the client."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    sent = time.perf_counter()
    first: float | None = None
    last = sent
    chunks = 0
    async with client.post(url + "/v1/completions", json=body, headers=headers) as r:
        if r.status != 200:
            text = (await r.read()).decode(errors="replace")[:300]
            raise ServerError(f"POST {url}/v1/completions answered {r.status}: {text}")
        async for line in r.content:  # one SSE line at a time, as it arrives
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.perf_counter()
            if first is None:
                first = now
            last = now
            chunks += 1
    if first is None:
        raise ServerError(f"POST {url}/v1/completions streamed no token")
    tpot = (last - first) / (output_tokens - 1) if output_tokens > 1 else None
    return Timed(len(prompt), output_tokens, sent, first - sent, tpot, last - sent)


WORKER: ContextVar[int] = ContextVar("closed_loop_worker", default=0)
"""Which of `run_closed_loop`'s workers sends the request being sent: one client's requests, in order."""


async def run_closed_loop(
    jobs: list[tuple[list[int], int]],
    concurrency: int,
    send: Send,
    deadline: float | None = None,
) -> list[Timed]:
    """`jobs` (prompt, output tokens) in order, `concurrency` at a time: each worker takes the next job
    as soon as its previous one ends, so the server holds `concurrency` requests throughout. Past
    `deadline` (time.monotonic()) no new job starts; those in flight finish."""
    queue = list(reversed(jobs))
    results: list[Timed] = []

    async def worker(number: int) -> None:
        WORKER.set(number)  # each worker runs in a task of its own, with its own copy of the context
        while queue and (deadline is None or time.monotonic() < deadline):
            prompt, output = queue.pop()
            results.append(await send(prompt, output))

    await asyncio.gather(*(worker(number) for number in range(min(concurrency, len(jobs)))))
    return results
