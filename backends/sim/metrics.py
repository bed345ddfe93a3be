"""The simulator's engine statistics and their Prometheus text exposition under vLLM's metric names.

Written by hand (no prometheus_client) to keep the hot path to a few integer additions. Like vLLM,
every sample is labelled with `engine="0"` and the first served model name, and the text is laid out as
the prometheus_client vLLM uses writes it: a counter's `# HELP`/`# TYPE` lines name it with `_total`,
and every counter and histogram is followed by a `<name>_created` gauge (the Unix time the simulated
engine started).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

# vLLM's own bucket boundaries (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)  # fmt: skip

# vllm:request_time_per_output_token_seconds uses the inter-token buckets; queue time the e2e ones.
TPOT_BUCKETS = ITL_BUCKETS
QUEUE_BUCKETS = E2E_BUCKETS

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self, name: str, labels: str, help_text: str, created: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, bucket_count in zip(self.buckets, self.counts, strict=False):
            cumulative += bucket_count
            lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        lines.append(f"{name}_count{{{labels}}} {self.count}")
        return lines + _created(f"{name}_created", labels, help_text, created)


@dataclass(slots=True)
class EngineStats:
    """Live counters of one simulated engine; `kv_tokens` is what running requests hold in KV cache.

    Every duration is in simulated seconds.
    """

    model_name: str
    kv_capacity_tokens: int
    block_size: int = 16
    num_blocks: int | None = None  # None: derived from kv_capacity_tokens
    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))
    created: float = field(default_factory=time.time)

    def kv_usage(self) -> float:
        return min(1.0, self.kv_tokens / self.kv_capacity_tokens) if self.kv_capacity_tokens else 0.0

    def render(self) -> str:
        model = f'model_name="{_escape(self.model_name)}"'
        labels = f'engine="0",{model}'
        scalars: tuple[tuple[str, str, str, float], ...] = (
            ("gauge", "vllm:num_requests_running", "Requests in execution batches.", self.running),
            ("gauge", "vllm:num_requests_waiting", "Requests waiting to be scheduled.", self.waiting),
            ("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage, 1 is full.", self.kv_usage()),
            ("counter", "vllm:prompt_tokens", "Prefill tokens processed.", self.prompt_tokens),
            ("counter", "vllm:generation_tokens", "Generation tokens processed.", self.generation_tokens),
            ("counter", "vllm:prefix_cache_queries", "Prefix cache queries.", self.prefix_cache_queries),
            ("counter", "vllm:prefix_cache_hits", "Prefix cache hit tokens.", self.prefix_cache_hits),
            ("counter", "vllm:num_preemptions", "Cumulative preemptions.", self.preemptions),
        )
        created = repr(self.created)
        lines: list[str] = []
        for kind, name, help_text, value in scalars:
            if kind == "counter":
                total = f"{name}_total"
                lines += (
                    f"# HELP {total} {help_text}",
                    f"# TYPE {total} counter",
                    f"{total}{{{labels}}} {value}",
                )
                lines += _created(f"{name}_created", labels, help_text, created)
            else:
                lines += (f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}")
        success_help = "Count of successfully processed requests."
        lines += (
            f"# HELP vllm:request_success_total {success_help}",
            "# TYPE vllm:request_success_total counter",
        )
        for reason, value in self.finished.items():
            lines.append(
                f'vllm:request_success_total{{engine="0",finished_reason="{reason}",{model}}} {value}'
            )
        lines += (
            f"# HELP vllm:request_success_created {success_help}",
            "# TYPE vllm:request_success_created gauge",
        )
        for reason in self.finished:
            lines.append(
                f'vllm:request_success_created{{engine="0",finished_reason="{reason}",{model}}} {created}'
            )
        lines += self.ttft.render("vllm:time_to_first_token_seconds", labels, "Time to first token.", created)
        lines += self.itl.render("vllm:inter_token_latency_seconds", labels, "Inter-token latency.", created)
        lines += self.e2e.render("vllm:e2e_request_latency_seconds", labels, "End-to-end latency.", created)
        lines += self.tpot.render(
            "vllm:request_time_per_output_token_seconds",
            labels,
            "Mean time per output token per request.",
            created,
        )
        lines += self.queue.render("vllm:request_queue_time_seconds", labels, "Time spent waiting.", created)
        num_blocks = (
            self.num_blocks if self.num_blocks is not None else self.kv_capacity_tokens // self.block_size
        )
        lines += (
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            # Like vLLM: labelled with engine and the CacheConfig fields (the ones the simulator models,
            # and vLLM's defaults for the others), not with model_name.
            f'vllm:cache_config_info{{block_size="{self.block_size}",cache_dtype="auto",'
            f'enable_prefix_caching="True",engine="0",kv_cache_size_tokens="{num_blocks * self.block_size}",'
            f'num_cpu_blocks="None",num_gpu_blocks="{num_blocks}",prefix_caching_hash_algo="sha256",'
            'sliding_window="None"} 1.0',
        )
        lines.append("")
        return "\n".join(lines)


def _created(name: str, labels: str, help_text: str, created: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {created}"]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
