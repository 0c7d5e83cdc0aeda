"""What kvscope collects from the engine while a workload runs, beside the request rows: the
/metrics sampler (in a child process of its own), the KV event listener, and the per-request
joins that finalize makes with their series."""

from kvscope.collect.kv_events import KvEventListener
from kvscope.collect.metrics import Sampler
from kvscope.collect.scraper import MetricsScraper
from kvscope.collect.series import counter_delta, nearest

__all__ = ["KvEventListener", "MetricsScraper", "Sampler", "counter_delta", "nearest"]
