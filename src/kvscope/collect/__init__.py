"""What kvscope collects from the engine while a workload runs, beside the request rows."""

from kvscope.collect.metrics import (
    SCHEMA,
    Gap,
    Sampler,
    ScrapeSummary,
    instant_series,
)
from kvscope.collect.scraper import MetricsScraper
from kvscope.collect.series import counter_delta, nearest

__all__ = [
    "SCHEMA",
    "Gap",
    "MetricsScraper",
    "Sampler",
    "ScrapeSummary",
    "counter_delta",
    "instant_series",
    "nearest",
]
