"""httpx.AsyncClient vs aiohttp.ClientSession vs Switchyard's own backend client as the forwarding client
of a bare Litestar proxy.

What it measures
    One bare Litestar proxy (``POST /v1/chat/completions``: read the body bytes, forward them upstream,
    return upstream's status and bytes) is run as three server processes: once forwarding with one
    shared ``httpx.AsyncClient`` (pooled keep-alive, limits = ``--connections``), once with one shared
    ``aiohttp.ClientSession`` (``TCPConnector(limit=--connections)``, keep-alive), once with the gateway's
    ``BackendClient`` (gateway/upstream/client.py, the same pool size).  For each it measures

    * ``json``   - non-streaming: ~200-token request, upstream answers a fixed chat.completion with usage;
    * ``stream`` - the same request with ``"stream": true``: upstream answers 64 ``chat.completion.chunk``
      SSE events + a usage chunk + ``data: [DONE]``; the proxy relays every piece it reads from the
      upstream socket through a Litestar ``Stream`` over an async generator.

    The upstream sends each response body in one go (a static body), so the proxy usually reads a
    streamed answer in a few socket reads, not 66: this measures per-response relaying cost (connection
    pool, request/response parsing, Stream machinery, chunked encoding), not per-token pacing.

How it runs
    The proxy (uvicorn + uvloop + httptools, one worker, no access log; or ``--server granian``) is pinned
    to the first CPU; upstream and load generator share the second.  Upstream is nginx when installed
    (static bodies from a private config in a temp dir), else a small aiohttp.web server; the load
    generator is ``wrk`` (closed loop, Lua script for the POST) when installed, else a bounded aiohttp
    closed-loop generator.  Each mode gets a discarded warm-up, then one measured phase of ``--duration``
    seconds with ``--connections`` concurrent connections.  Every child runs in its own process group and
    is stopped on exit or Ctrl-C; only 127.0.0.1 is contacted.

How to read the output
    ``req/s``: completed responses per second (the proxy is the bottleneck: it has a core to itself).
    ``p50``/``p99``: client-side latency at that concurrency, in ms (closed loop, so ~ connections / req/s).
    ``CPU us/req``: user+system CPU of the proxy's process group over the measured phase / requests - the
    most stable figure; it is what the gateway pays per request for the client library plus framework.
    ``proxy CPU%``: share of its core the proxy used; well under 100 means it was not the bottleneck
    (the load side or other processes on the machine were), so its req/s understates it.
    ``aiohttp/httpx``, ``switchyard/httpx``: ratios against the httpx row; > 1 for req/s means faster,
    < 1 for latency and CPU means cheaper.  Figures move 10-40 % between runs on a shared VM: compare rows
    of one run, and use ``--reps N`` (median of N alternating rounds) when the difference is small.

Usage: ``python -m loadtest.bench.http_clients [--duration 10] [--connections 64]
[--server uvicorn|granian] [--json out.json]`` (``make bench-clients ARGS="..."``).
"""
