"""Capacity from a vLLM server's own load report: its Prometheus `/metrics`, found at discovery, polled by the
load watcher, and read into the same Load as SGLang's `/v1/loads`."""

from __future__ import annotations

import pytest

from gen_pipeline.fleet.loads import Load, parse_metrics


def metrics(running: int, waiting: int, usage: float = 0.95, usage_name: str = "vllm:kv_cache_usage_perc") -> str:
    """vLLM's /metrics text as a server with two engines writes it: each count split between them, both at `usage`,
    among series the watcher does not read."""
    first, second = running // 2, running - running // 2
    return (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {float(first)}\n'
        f'vllm:num_requests_running{{engine="1",model_name="m"}} {float(second)}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {float(waiting)}\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 0.0\n'
        f"# TYPE {usage_name} gauge\n"
        f'{usage_name}{{engine="0",model_name="m"}} {usage}\n'
        f'{usage_name}{{engine="1",model_name="m"}} {usage}\n'
        "# TYPE vllm:prompt_tokens counter\n"
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 1234.0\n'
        "# TYPE vllm:e2e_request_latency_seconds histogram\n"
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 3.0\n'
        'vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0\n'
        'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 4.0\n'
        'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 2.5\n'
    )


def series(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


COUNTS = ("vllm:num_requests_running 4", "vllm:num_requests_waiting 1")  # one unlabelled engine


@pytest.mark.parametrize(
    ("text", "load"),
    [
        (metrics(7, 65), Load(7, 65, 0.95)),  # counts summed over the engines' label sets
        (metrics(7, 65, 0.5, "vllm:gpu_cache_usage_perc"), Load(7, 65, 0.5)),  # the usage gauge's old name
        (
            series(
                'vllm:num_requests_running{engine="0"} 1',
                'vllm:num_requests_running{engine="1"} 2',
                "vllm:num_requests_waiting 0",
                'vllm:kv_cache_usage_perc{engine="0"} 0.25',
                'vllm:kv_cache_usage_perc{engine="1"} 0.75',
                "vllm:gpu_cache_usage_perc 0.9",
            ),
            Load(3, 0, 0.5),  # each engine has its own pool: their mean; the current name before the old one
        ),
        (series(*COUNTS), Load(4, 1, None)),  # no usage gauge
        (series(*COUNTS, "vllm:kv_cache_usage_perc NaN"), Load(4, 1, None)),
        (series("vllm:num_requests_running 4"), None),  # no waiting series
        (series("vllm:num_requests_waiting 4"), None),  # no running series
        (series("vllm:num_requests_running 2.5", "vllm:num_requests_waiting 0"), None),  # not a count
        (series("vllm:num_requests_running -1", "vllm:num_requests_waiting 0"), None),
        (series("vllm:num_requests_running NaN", "vllm:num_requests_waiting 0"), None),
        (series("sglang:num_running_reqs 4", "sglang:num_queue_reqs 1"), None),  # another server's series
        ("", None),
        ("<html><body>Not Found</body></html>", None),  # garbage the parser refuses
        ('{"loads": [{"num_running_reqs": 3, "num_waiting_reqs": 2}]}', None),
        ('vllm:num_requests_running{engine="0} 1\nvllm:num_requests_waiting 0\n', None),
    ],
)
def test_parse_metrics(text: str, load: Load | None) -> None:
    """Running and waiting requests summed over their label sets, the KV-cache usage under either name; text
    without both counts, or that does not parse, is no sample."""
    assert parse_metrics(text) == load
