"""Routing under overload: spill-over counting what was sent since the last scrape, the shedding order,
classification of batch work, and the policy's header mapping (issue 18)."""

from __future__ import annotations

import textwrap
from collections import Counter

import pytest

from backends.models import Backend, BackendConfig, EngineLoad, PoolConfig, build_backends
from backends.yamlfile import ConfigError
from policies.config import Route, load_policy, parse_policy
from policies.engine import PolicyEngine
from policies.predict import saturation_reason
from policies.presets import resolve
from tests.unit.policies.test_engine import _request

MODEL = "llama-3.1-8b"


def _fleet(model: str = MODEL) -> list[Backend]:
    """The demo fleet's shape: h100-0, h100-1 (nvidia, 8k context), mi300x-0, mi300x-1 (amd, 32k)."""
    pools = [
        PoolConfig(
            name=name,
            vendor=vendor,
            accelerator=accel,
            price_per_gpu_hour=price,
            backends=[
                BackendConfig(url=f"http://127.0.0.1:{port + i}", models=[model], max_model_len=length)
                for i in range(2)
            ],
        )
        for name, vendor, accel, price, port, length in (
            ("h100", "nvidia", "h100", 2.9, 9000, 8192),
            ("mi300x", "amd", "mi300x", 1.75, 9100, 32768),
        )
    ]
    backends = build_backends(pools)
    for b in backends:
        b.load = EngineLoad(scraped_at=100.0)
    return backends


def _preset(name: str, backends: list[Backend]) -> PolicyEngine:
    return PolicyEngine(load_policy(resolve(name)), backends)


MARK = ", max_slowdown: 6}"


def unmarked_balanced() -> str:
    """`balanced` without its decode mark on long-context (`max_slowdown: 6`), for what the mark changes."""
    text = resolve("balanced").read_text()
    assert text.count(MARK) == 1
    return text.replace(MARK, "}")


def _long_context(backends: list[Backend]) -> tuple[PolicyEngine, Route]:
    loaded = load_policy(resolve("balanced"))
    return PolicyEngine(loaded, backends), loaded.policy.routes["long-context"]


def _chat(tokens: int = 10, **body) -> dict:
    return {"messages": [{"role": "user", "content": "hello " * tokens}], **body}


# --- spill-over ---------------------------------------------------------------------------------------


def test_a_burst_between_scrapes_spills_interactive_requests_to_mi300x():
    backends = _fleet()
    engine = _preset("balanced", backends)
    # The last scrape found every backend idle; 30 streamed chat requests of ~3,000 (estimated) tokens
    # arrive before the next one. Without counting what it sends, the engine put them all on the H100s.
    chat = _chat(2000, stream=True, max_tokens=200)
    chosen: list[Backend] = []
    for _ in range(30):
        decision, trace = engine.decide_traced(_request(chat), backends)
        assert decision.request_class == "interactive" and not decision.hold
        assert trace.ctx is not None and trace.ctx.predicted_ttft is not None
        predicted = dict(zip(trace.kept, trace.ctx.predicted_ttft, strict=True))
        best = decision.candidates[0]
        # Never a backend predicted to miss the 800 ms SLO while another is predicted to meet it.
        if min(predicted.values()) <= 0.8:
            assert predicted[best] <= 0.8, (best.name, predicted)
        chosen.append(best)
    assert chosen[0].pool.vendor == "nvidia", "an idle H100 is the fastest"
    vendors = [b.pool.vendor for b in chosen]
    assert vendors.count("amd") >= 10 and vendors.count("nvidia") >= 10, "the burst spreads"
    # At the end of the burst each H100's predicted TTFT is past the SLO: the next request goes to an
    # MI300X whose prediction still meets it.
    decision, trace = engine.decide_traced(_request(chat), backends)
    assert trace.ctx is not None and trace.ctx.predicted_ttft is not None
    predicted = {b.name: t for b, t in zip(trace.kept, trace.ctx.predicted_ttft, strict=True)}
    assert decision.candidates[0].pool.vendor == "amd" and predicted[decision.candidates[0].name] < 0.8
    # A new scrape replaces the estimate: the H100s (still idle by the scrape) are preferred again.
    for b in backends:
        b.load = EngineLoad(scraped_at=101.0)
    assert engine.choose(_request(chat), backends).candidates[0].pool.vendor == "nvidia"


def test_h100s_predicted_to_miss_send_interactive_work_to_the_mi300x():
    """A scraped queue on the H100s, plus what this gateway sent them since, puts their predicted TTFT
    past the SLO: the next requests go to the MI300X, and none back to an H100 until a scrape says so."""
    backends = _fleet()
    engine = _preset("balanced", backends)
    for b in backends[:2]:
        b.load = EngineLoad(running=60, waiting=1, scraped_at=100.0)
        b.observed.ttft = 0.3
    for b in backends[2:]:
        b.load = EngineLoad(running=120, waiting=0, scraped_at=100.0)  # busier, but no queue
        b.observed.ttft = 0.3
    chat = _request(_chat(300, stream=True, max_tokens=100))
    # 0.3 s x (1 + 1/2) = 0.45 s: the H100s meet 800 ms, and take their share.
    sent = Counter(engine.choose(chat, backends).candidates[0].name for _ in range(12))
    assert sent["h100-0"] + sent["h100-1"] >= 1
    # Three more sent to each H100 since that scrape queue behind it: 0.3 x (1 + 4/2) = 0.9 s > 0.8 s.
    for b in backends[:2]:
        for _ in range(3):
            engine.recent.sent(b, 300)
    after = [engine.choose(chat, backends).candidates[0] for _ in range(20)]
    assert {b.pool.vendor for b in after} == {"amd"}
    for b in backends[:2]:
        b.load = EngineLoad(running=60, waiting=0, scraped_at=101.0)
    assert any(engine.choose(chat, backends).candidates[0].pool.vendor == "nvidia" for _ in range(4))


# --- shedding -----------------------------------------------------------------------------------------


def _held(engine: PolicyEngine, backends: list[Backend], body: dict, headers=None) -> tuple[str, bool]:
    decision = engine.choose(_request(body, headers), backends)
    return decision.request_class, decision.hold


@pytest.mark.parametrize(
    ("waiting", "held"),
    [
        (0, set()),
        (1, {"batch"}),
        (2, {"batch", "default"}),
        (5, {"batch", "default", "long-context"}),
        (50, {"batch", "default", "long-context"}),
    ],
)
def test_shedding_order_batch_then_default_then_long_context_never_interactive(waiting, held):
    backends = _fleet()
    engine = _preset("balanced", backends)
    for b in backends:
        b.load = EngineLoad(running=40, waiting=waiting, kv_cache_usage=0.5, scraped_at=100.0)
    requests = {
        "interactive": _chat(stream=True, max_tokens=100),
        "batch": _chat(max_tokens=800, n=4),
        "default": _chat(max_tokens=100),
        "long-context": _chat(9000, max_tokens=100),
    }
    found = {}
    for cls, body in requests.items():
        got_class, hold = _held(engine, backends, body)
        assert got_class == cls
        found[cls] = hold
    assert {cls for cls, hold in found.items() if hold} == held
    assert found["interactive"] is False


def test_a_held_request_is_not_counted_as_sent():
    backends = _fleet()
    engine = _preset("balanced", backends)
    for b in backends:
        b.load = EngineLoad(running=40, waiting=3, scraped_at=100.0)
    for _ in range(5):
        assert engine.choose(_request(_chat(max_tokens=800, n=4)), backends).hold
    assert all(engine.recent.get(b) is None for b in backends)


def test_shed_routes_get_backpressure_and_a_policy_must_protect_one_class():
    policy = load_policy(resolve("balanced")).policy
    assert policy.routes["batch"].backpressure is not None
    assert policy.routes["default"].backpressure is not None  # implied by `shed: true`
    assert policy.routes["interactive"].backpressure is None
    text = textwrap.dedent(
        """\
        routes:
          default:
            prefer: any
            shed: true
        """
    )
    with pytest.raises(ConfigError) as err:
        parse_policy(text, "<p>")
    assert err.value.line == 4 and "nothing would be protected" in str(err.value)
    with pytest.raises(ConfigError) as err:
        parse_policy(text.replace("shed: true", "shed: sometimes"), "<p>")
    assert err.value.line == 4


# --- classification -----------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["balanced", "latency-first"])
@pytest.mark.parametrize("n", [1, 4])
def test_non_streaming_batch_rows_are_batch(preset, n):
    backends = _fleet()
    engine = _preset(preset, backends)
    for max_tokens in (512, 1024):
        decision = engine.choose(_request(_chat(200, max_tokens=max_tokens, n=n)), backends)
        assert decision.request_class == "batch"
        if preset == "latency-first":
            assert decision.candidates[0].pool.vendor == "amd"
    streamed = engine.choose(_request(_chat(200, stream=True, max_tokens=300)), backends)
    assert streamed.request_class == "interactive"
    assert streamed.candidates[0].pool.vendor == "nvidia"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"priority": "u=6, i"}, "batch"),  # RFC 9218 background urgency
        ({"Priority": "u=7"}, "batch"),
        ({"priority": "u=1"}, "interactive"),  # not mapped: the rules decide (streamed chat)
        ({"x-request-priority": "LOW"}, "batch"),
        ({"x-switchyard-priority": "batch"}, "batch"),
    ],
)
def test_policy_header_mapping_decides_before_the_rules(headers, expected):
    backends = _fleet()
    engine = _preset("balanced", backends)
    decision = engine.choose(_request(_chat(stream=True, max_tokens=100), headers), backends)
    assert decision.request_class == expected


def test_header_mapping_to_an_unknown_class_points_at_its_line():
    text = textwrap.dedent(
        """\
        headers:
          x-priority:
            bulk: bulk
        routes:
          default: {}
        """
    )
    with pytest.raises(ConfigError) as err:
        parse_policy(text, "<p>")
    assert err.value.line == 3 and "`bulk`" in str(err.value)


def test_answered_requests_leave_the_prefill_estimate_even_without_scrapes():
    """A backend that is never scraped (no vLLM metrics, or scraping off) is not predicted ever slower by
    requests it already answered: a request counted as pending prefill leaves the estimate with its answer
    (before, 1,000 answered requests made the default route shed every request of an idle backend)."""
    backends = _fleet()
    for b in backends:
        b.load = EngineLoad(scraped_at=None)
    engine = _preset("balanced", backends)
    decisions = []
    for _ in range(1000):
        decision = engine.choose(_request(_chat(200, max_tokens=50)), backends)
        assert decision.candidates and not decision.hold, decision
        decision.answered(_request(_chat(200, max_tokens=50)).prompt_tokens_estimate)
        decisions.append(decision)
    assert all(recent.prompt_tokens == 0 for recent in engine.recent.by_backend.values())
    # Answered once: a second call changes nothing.
    decisions[0].answered(10**6)
    assert all(recent.prompt_tokens == 0 for recent in engine.recent.by_backend.values())
    # Requests still waiting for their answer do count (a burst between scrapes).
    pending = [engine.choose(_request(_chat(2000, max_tokens=50)), backends) for _ in range(200)]
    assert any(d.hold or d.candidates[0].pool.vendor == "amd" for d in pending)


# --- where balanced puts batch and long-context work ---------------------------------------------------


def _running(backend: Backend, cls: str, count: int, n: int = 1, tokens: int = 0) -> None:
    """`count` requests of class `cls` with `n` choices and `tokens` prompt tokens each in flight on
    `backend`, as the gateway's `hold` counts them."""
    backend.inflight += count
    backend.inflight_seqs += count * n
    backend.inflight_by_class[cls] = backend.inflight_by_class.get(cls, 0) + count
    by_tokens = backend.prompt_tokens_by_class
    by_tokens[cls] = by_tokens.get(cls, 0) + count * tokens


def test_batch_goes_to_the_h100s_and_to_the_mi300x_only_when_they_are_full():
    backends = _fleet()
    engine = _preset("balanced", backends)
    batch = _request(_chat(200, max_tokens=800, n=4))
    # The MI300X's time is long-context's, the one class only they can serve: batch takes the H100s first,
    # both of them (least loaded first).
    used = Counter(engine.choose(batch, backends).candidates[0].name for _ in range(8))
    assert set(used) == {"h100-0", "h100-1"}
    # The H100s hold their mark of batch sequences: the next job goes to an MI300X rather than wait.
    for b in backends[:2]:
        _running(b, "batch", 64, n=4)
    decision = engine.choose(batch, backends)
    assert not decision.hold and decision.candidates[0].pool.vendor == "amd"


def test_long_context_is_spread_by_its_own_prompt_tokens_in_flight():
    backends = _fleet()
    engine = _preset("balanced", backends)
    mi0, mi1 = backends[2], backends[3]
    # mi300x-0 runs 6 batch jobs and 5 long prompts of 10k tokens; mi300x-1 runs 4 long prompts of 18k.
    # By the total in flight (11 vs 4), or by long-context requests (5 vs 4), the next long prompt would
    # go to mi300x-1, which has 72k tokens to decode beside it against mi300x-0's 50k.
    _running(mi0, "batch", 6, n=4, tokens=500)
    _running(mi0, "long-context", 5, tokens=10_000)
    _running(mi1, "long-context", 4, tokens=18_000)
    for doc in range(8):  # different documents: whatever their prefixes hash to
        body = {
            "messages": [{"role": "user", "content": f"document {doc} " + "text " * 9000}],
            "max_tokens": 100,
        }
        decision = engine.choose(_request(body), backends)
        assert decision.request_class == "long-context"
        assert decision.candidates[0] is mi0
    # A long prompt that fits the H100s' 8k goes to them: the MI300X keep their time for those that do not.
    fits = engine.choose(_request(_chat(4_500, max_tokens=200)), backends)  # ~6,750 tokens
    assert fits.request_class == "long-context" and fits.candidates[0].pool.vendor == "nvidia"


def test_batch_leaves_seats_for_a_burst_of_interactive_work():
    """A backend whose requests from this gateway hold 256 sequences takes no more batch, though its queue
    is empty and its KV cache half free: a batch job holds its sequences for its whole (long) output and
    each slows every decode step, so the rest of the step is kept for interactive bursts. Batch waits."""
    backends = _fleet()
    engine = _preset("balanced", backends)
    for b in backends:
        b.load = EngineLoad(running=256, waiting=0, kv_cache_usage=0.5, scraped_at=100.0)
        _running(b, "batch", 62, n=4)  # 62 requests, 248 seats
        _running(b, "interactive", 8)
    batch = engine.choose(_request(_chat(200, max_tokens=800, n=4)), backends)
    assert batch.request_class == "batch" and batch.hold
    chat = engine.choose(_request(_chat(200, stream=True, max_tokens=100)), backends)
    assert chat.request_class == "interactive" and not chat.hold
    assert chat.candidates[0].pool.vendor == "nvidia"
    # One backend finishes an n=4 job: below the mark, batch goes there, not to the others.
    backends[3].inflight -= 1
    backends[3].inflight_seqs -= 4
    backends[3].inflight_by_class["batch"] -= 1
    batch = engine.choose(_request(_chat(200, max_tokens=800, n=4)), backends)
    assert not batch.hold and batch.candidates[0] is backends[3]
    policy = load_policy(resolve("balanced")).policy
    assert policy.routes["batch"].backpressure.max_wait_ms >= 10_000  # a job waits, a chat would not


def test_the_seat_mark_counts_sequences_not_requests():
    """70 requests in flight are few, but 62 of them with n=4 hold 256 of vLLM's seats with the 8 chats:
    counted by requests (the preset's mark before), a burst found those seats taken by jobs running for
    20 s."""
    backends = _fleet()
    route = load_policy(resolve("balanced")).policy.routes["batch"]
    assert route.saturation.max_seqs == 256
    for b in backends:
        _running(b, "batch", 62, n=4)
        _running(b, "interactive", 8)
    limits = route.saturation
    assert all(saturation_reason(b, limits) == "256 sequences in flight (limit 256)" for b in backends)
    backends[0].inflight_seqs -= 1
    assert saturation_reason(backends[0], limits) is None


def test_with_the_decode_mark_long_context_is_held_while_the_mi300x_decode_slowly_chat_is_not():
    """Past the MI300X's capacity for long prompts their prefills slow every decode beside them, and slow
    steps keep more sequences in flight, which slow them further. Once the time per token measured there is
    6x what its model takes at light load (`max_slowdown: 6`; an 8B model on an MI300X, 9 ms: 54 ms, under
    the 80 ms a long-context client expects), a long prompt that fits nowhere else is held (then refused
    with 429), and chat keeps its H100s."""
    backends = _fleet()
    engine, route = _long_context(backends)
    assert route.saturation.max_slowdown == 6 and route.saturation.max_tpot_ms is None and route.shed
    assert route.backpressure is not None and route.backpressure.max_wait_ms <= 3000  # within its TTFT SLO
    for b in backends[2:]:
        assert b.pool.light_load_tpot_s == pytest.approx(0.009)
        b.load = EngineLoad(running=30, waiting=0, kv_cache_usage=0.4, scraped_at=100.0)
        b.observed.add(0.9, 0.065)
        _running(b, "long-context", 30, tokens=12_000)
    assert saturation_reason(backends[2], route.saturation) == "decoding at 65 ms per token (limit 54 ms)"
    too_long = engine.choose(_request(_chat(12_000, max_tokens=200)), backends)
    assert too_long.request_class == "long-context" and too_long.hold
    fits_h100 = engine.choose(_request(_chat(4_500, max_tokens=200)), backends)  # ~6,750 tokens
    assert fits_h100.request_class == "long-context" and not fits_h100.hold
    assert fits_h100.candidates[0].pool.vendor == "nvidia"
    chat = engine.choose(_request(_chat(200, stream=True, max_tokens=100)), backends)
    assert not chat.hold and chat.candidates[0].pool.vendor == "nvidia"
    # Decoding is back under the mark: long prompts are admitted again.
    for b in backends[2:]:
        b.observed.tpot = 0.050
    assert not engine.choose(_request(_chat(12_000, max_tokens=200)), backends).hold


def test_the_decode_mark_is_relative_to_the_model_so_a_70b_fleet_decoding_at_90_ms_is_not_held():
    """A 70B model on an MI300X reads ~9x the weights of an 8B one at every step: 79 ms a token at light
    load, ~75-100 ms at normal load. A mark in milliseconds that holds an 8B fleet (60 ms) refused every
    long prompt there; 6x its light load does not, and its 120 ms SLO still holds a slower one."""
    backends = _fleet("meta-llama/Llama-3.1-70B-Instruct")
    engine, route = _long_context(backends)
    for b in backends[2:]:
        assert b.pool.light_load_tpot_s == pytest.approx(0.07875)
        b.load = EngineLoad(running=30, waiting=0, kv_cache_usage=0.6, scraped_at=100.0)
        b.observed.add(0.5, 0.090)
        _running(b, "long-context", 30, tokens=12_000)
    assert saturation_reason(backends[2], route.saturation) is None
    # ~9,000 tokens: past an H100's 8k; a 70B MI300X prefills them in ~2 s, within the 3 s SLO
    decision = engine.choose(_request(_chat(6_000, max_tokens=200)), backends)
    assert not decision.hold and decision.candidates[0].pool.vendor == "amd"
    for b in backends[2:]:
        b.observed.tpot = 0.130  # past the route's 120 ms SLO: predicted to miss, held
    assert engine.choose(_request(_chat(6_000, max_tokens=200)), backends).hold


def test_a_model_of_unknown_size_gets_no_relative_mark():
    """A name that states no size (a fine-tune, a mixture of experts) leaves the light-load time unknown:
    no mark is better than one computed for the wrong model; the pool's `model_params_b` gives it."""
    backends = _fleet("acme-support-bot")
    _, route = _long_context(backends)
    for b in backends[2:]:
        assert b.pool.light_load_tpot_s is None
        b.load = EngineLoad(running=30, scraped_at=100.0)
        b.observed.add(0.9, 0.065)
        _running(b, "long-context", 30, tokens=12_000)
    assert saturation_reason(backends[2], route.saturation) is None
    given = PoolConfig(
        name="mi300x",
        vendor="amd",
        accelerator="mi300x",
        price_per_gpu_hour=1.75,
        model_params_b=8,
        backends=[BackendConfig(url="http://127.0.0.1:9100", models=["acme-bot"], max_model_len=8192)],
    )
    assert build_backends([given])[0].pool.light_load_tpot_s == pytest.approx(0.009)


def test_a_slow_measurement_does_not_close_a_backend_that_has_nothing_in_flight():
    """The time per token is measured on requests that have ended: with none in flight on a backend
    nothing would refresh it, and a class held on it would be held there for good. So the mark applies to
    a backend with work in flight, and a shed class that no backend can take on predictions alone (200 ms
    is past the route's 120 ms SLO too) sends its request to an idle backend, which measures it afresh."""
    backends = _fleet()
    engine, route = _long_context(backends)
    limits = route.saturation
    for b in backends[2:]:
        b.observed.add(0.9, 0.200)  # measured during a spike that has passed
    assert saturation_reason(backends[2], limits) is None
    decision = engine.choose(_request(_chat(12_000, max_tokens=200)), backends)
    assert not decision.hold and decision.candidates[0].pool.vendor == "amd"
    backends[2].load = EngineLoad(running=3, scraped_at=100.0)  # another replica's requests run there
    assert saturation_reason(backends[2], limits) == "decoding at 200 ms per token (limit 54 ms)"
    decision = engine.choose(_request(_chat(12_000, max_tokens=200)), backends)
    assert not decision.hold and decision.candidates[0] is backends[3]
    backends[3].load = EngineLoad(running=3, scraped_at=100.0)  # both busy and slow: held
    assert engine.choose(_request(_chat(12_000, max_tokens=200)), backends).hold
