"""Runs inside .venv-sglang, not kvscope's venv: SGLang 0.5.23's own code produces telemetry.

The tests (sglang_producer.py is their side) start this once per session with the flags kvscope
launches SGLang with, then send one JSON command a line on stdin and read one JSON reply a line
on stdout ({"ok": true, ...} or {"ok": false, "error": traceback}). What SGLang code does what:

- /metrics: SGLang's TokenizerMetricsCollector (labels from tokenizer_metric_labels(), so the
  `agent` custom label kvscope asks for), SchedulerMetricsCollector.init_new and a real
  RadixCache(enable_metrics=True) whose evict() counts evictions, in Prometheus multiprocess
  mode, rendered as add_prometheus_middleware does (CollectorRegistry + MultiProcessCollector
  -> generate_latest), served on the host/port SGLang parsed from kvscope's flags.
- a finished request: the agent label is read from kvscope's header by
  OpenAIServingBase.extract_custom_labels; timings go through SchedulerReqTimeStats /
  APIServerReqTimeStats (which observe the queue and per-stage histograms); the tokenizer
  collector gets observe_time_to_first_token / observe_one_finished_request with the labels
  TokenizerManager.collect_metrics builds; the record is written by
  RequestMetricsExporterManager.write_record (--export-metrics-to-file).
- KV events: EventPublisherFactory.create(kv_events_config) -> ZmqEventPublisher, publishing
  KVEventBatch of BlockStored / BlockRemoved / AllBlocksCleared, given field by field by the
  test, or made by a RadixCache(enable_kv_cache_events=True) from inserts and an eviction.
Emulated here, not SGLang code: the clock values of each request (given by the test); the
meta_info dict assembly that TokenizerManager._handle_batch_output does (the values in it come
from SGLang's time-stats methods); a lost batch (the publisher's own socket and sequence
counter are patched for one batch); the KV pool allocator the radix cache frees into.
"""

import asyncio
import json
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Prometheus multiprocess mode, as SGLang's set_prometheus_multiproc_dir() sets it: before
# anything imports prometheus_client. A new process gets a new directory (a restart).
_PROM_DIR = tempfile.TemporaryDirectory(prefix="kvscope-sglang-prom-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = _PROM_DIR.name

from server_args_probe import declare_torchvision_ops  # noqa: E402  (beside this file)


class _Unsent:
    """Stands in for the publisher's PUB socket while one batch goes out: the batch gets its
    sequence number and its place in the replay buffer, but never reaches live subscribers
    (what a high-water-mark drop or a slow joiner does)."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock

    def send_multipart(self, frames: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class Producer:
    def __init__(self, argv: list[str]) -> None:
        declare_torchvision_ops()
        import torch
        from prometheus_client import CollectorRegistry, multiprocess, values
        from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase
        from sglang.srt.managers.io_struct import GenerateReqInput
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.observability import req_time_stats
        from sglang.srt.observability.metrics_collector import (
            QueueCount,
            SchedulerMetricsCollector,
            SchedulerStats,
            TokenizerMetricsCollector,
            tokenizer_metric_labels,
        )
        from sglang.srt.observability.request_metrics_exporter import (
            RequestMetricsExporterManager,
        )
        from sglang.srt.runtime_context import SpawnRanks, get_observability, publish
        from sglang.srt.server_args import prepare_server_args
        from sglang.srt.utils.request_logger import RequestLogger
        from starlette.requests import Request

        self.torch, self.Request, self.GenerateReqInput = torch, Request, GenerateReqInput
        self.RadixKey, self.InsertParams, self.EvictParams = RadixKey, InsertParams, EvictParams
        self.RadixCache, self.CacheInitParams = RadixCache, CacheInitParams
        self.QueueCount, self.SchedulerStats, self.rts = QueueCount, SchedulerStats, req_time_stats
        self.multiprocess_mode = values.ValueClass.__name__ != "MutexValue"

        args = self.server_args = prepare_server_args(argv)
        # The tokenizer process: TokenizerManager.init_metric_collector_watchdog's collector,
        # its request logger (whose skip names the metrics exporter uses) and exporter.
        publish(args, role="tokenizer", ranks=SpawnRanks(world_rank=0))
        obs = get_observability()
        self.tokenizer = TokenizerMetricsCollector(
            server_args=args,
            labels=tokenizer_metric_labels(),
            bucket_time_to_first_token=obs.bucket_time_to_first_token,
            bucket_e2e_request_latency=obs.bucket_e2e_request_latency,
            bucket_inter_token_latency=obs.bucket_inter_token_latency,
        )
        logger = RequestLogger(
            log_requests=obs.log_requests,
            log_requests_level=obs.log_requests_level,
            log_requests_format=obs.log_requests_format,
            log_requests_target=obs.log_requests_target,
        )
        _, obj_skip, out_skip = logger.metadata
        self.exporter = RequestMetricsExporterManager(args, obj_skip, out_skip)

        class Serving(OpenAIServingBase):  # only for its header parsing
            def _request_id_prefix(self) -> str:
                return "kvscope-"

            def _convert_to_internal_request(self, *a: Any, **kw: Any) -> Any:
                raise NotImplementedError

        self.serving = Serving(type("TokenizerManagerStandIn", (), {"server_args": args})())

        # The scheduler process: its collector and its radix cache (metrics on).
        publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
        ctx = SchedulerMetricsCollector.init_new(
            server_args=args,
            enable_priority_scheduling=False,
            enable_lora=False,
            enable_hierarchical_cache=bool(args.enable_hierarchical_cache),
        )
        assert ctx.collector is not None, "SGLang built no scheduler metrics collector"
        self.scheduler = ctx.collector
        self.cache = RadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=_FreeingAllocator(),
                page_size=args.page_size or 1,
                eviction_policy=args.radix_eviction_policy,
                enable_metrics=True,
            )
        )
        self._next_token = 0
        self.registry = CollectorRegistry()  # as sglang.srt.utils.add_prometheus_middleware
        multiprocess.MultiProcessCollector(self.registry)
        self.served = 0
        self.http = self._serve(args.host, args.port)
        self.publisher: Any = None

    # --- /metrics -------------------------------------------------------------------------

    def _serve(self, host: str, port: int) -> ThreadingHTTPServer:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        producer = self

        class Metrics(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                producer.served += 1  # counted before rendering: a later count saw later state
                body = generate_latest(producer.registry)
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((host, port), Metrics)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def op_info(self) -> dict[str, Any]:
        a = self.server_args
        return {
            "tokenizer_labels": self.tokenizer.labels,
            "multiprocess": self.multiprocess_mode,
            "host": a.host,
            "port": a.port,
            "max_total_tokens": a.max_total_tokens,
            "page_size": a.page_size,
            "kv_events_config": a.kv_events_config,
            "export_dir": a.export_metrics_to_file_dir,
            "pid": os.getpid(),
        }

    def op_render(self) -> dict[str, Any]:
        from prometheus_client import generate_latest

        return {"text": generate_latest(self.registry).decode()}

    def op_served(self) -> dict[str, Any]:
        return {"served": self.served}

    def op_constants(self, context_len: int) -> dict[str, Any]:
        """Scheduler.init_metrics' emit_constants, with the pool size SGLang parsed."""
        a = self.server_args
        self.scheduler.emit_constants(
            max_total_num_tokens=a.max_total_tokens,
            max_total_num_tokens_swa=None,
            weight_memory_usage_gb=0.0,
            kv_cache_memory_usage_gb=0.0,
            graph_memory_usage_gb={},
            max_running_requests_under_SLO=None,
            page_size=a.page_size,
            num_pages=a.max_total_tokens // a.page_size,
            context_len=context_len,
            startup_available_gpu_memory_gb=0.0,
        )
        return {}

    def op_stats(self, stats: dict[str, Any]) -> dict[str, Any]:
        fields = dict(stats)
        for queue in ("num_running_reqs", "num_queue_reqs"):
            if queue in fields:
                fields[queue] = self.QueueCount(total=fields[queue])
        self.scheduler.log_stats(self.SchedulerStats(**fields))
        return {}

    def op_evict(self, tokens: int) -> dict[str, Any]:
        """Insert `tokens` new tokens into the radix cache, then evict them (RadixCache.evict
        records sglang:evicted_tokens_total itself)."""
        ids = list(range(self._next_token, self._next_token + tokens))
        self._next_token += tokens
        value = self.torch.arange(tokens, dtype=self.torch.int64)
        self.cache.insert(self.InsertParams(key=self.RadixKey(token_ids=ids), value=value))
        result = self.cache.evict(self.EvictParams(num_tokens=tokens))
        return {"evicted": result.num_tokens_evicted}

    # --- one finished request -------------------------------------------------------------

    def op_request(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        cached_details: dict[str, int] | None,
        dispatch_s: float,
        queue_s: float,
        prefill_s: float,
        decode_s: float,
        stream: bool,
    ) -> dict[str, Any]:
        """One finished request, from the header kvscope sends to its metrics and export line.
        Durations in seconds: created -(dispatch)-> in the scheduler's wait queue -(queue)->
        forward -(prefill)-> first token -(decode)-> finished."""
        raw = self.Request(
            {
                "type": "http",
                "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            }
        )
        custom_labels = self.serving.extract_custom_labels(raw)
        obj = self.GenerateReqInput(
            text="kvscope conformance prompt",
            rid=body["rid"],
            session_id=body.get("session_id"),
            custom_labels=custom_labels,
            stream=stream,
        )
        t0 = time.perf_counter()
        api = self.rts.APIServerReqTimeStats()
        api.set_created_time(t0)
        sched = self.rts.SchedulerReqTimeStats()
        sched.set_metrics_collector(self.scheduler)
        sched.set_scheduler_recv_time(t0 + dispatch_s / 2)
        # observes per_stage_req_latency{stage="request_process"}: not a prefill
        sched.set_wait_queue_entry_time(t0 + dispatch_s)
        forward = t0 + dispatch_s + queue_s
        sched.set_forward_entry_time(forward)  # observes sglang:queue_time_seconds
        prefilled = forward + prefill_s
        sched.set_prefill_finished_time(prefilled)  # per_stage_req_latency{prefill_forward}
        api.set_first_token_time(prefilled)
        api.set_finished_time(prefilled + decode_s)

        meta: dict[str, Any] = {
            "id": obj.rid,
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            **sched.convert_to_output_meta_info(),
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens,
            "cached_tokens_details": cached_details,
            "e2e_latency": api.get_e2e_latency(),
            **api.convert_to_output_meta_info(sched, completion_tokens),
        }
        # TokenizerManager.collect_metrics: the collector's labels, then the request's own.
        labels = dict(self.tokenizer.labels)
        labels.update(custom_labels or {})
        self.tokenizer.observe_time_to_first_token(
            labels, api.get_first_token_latency(), stream=stream
        )
        self.tokenizer.observe_one_finished_request(
            labels,
            prompt_tokens,
            completion_tokens,
            cached_tokens,
            api.get_e2e_latency(),
            False,
            cached_details,
            is_streaming=stream,
            time_per_output_token=api.get_time_per_output_token(completion_tokens),
        )
        if self.exporter.exporter_enabled():
            asyncio.run(self.exporter.write_record(obj, {"meta_info": meta}))
        return {"custom_labels": custom_labels, "meta_info": meta}

    # --- KV events ------------------------------------------------------------------------

    def op_kv_open(self, wait_s: float = 15.0) -> dict[str, Any]:
        from sglang.srt.disaggregation.kv_events import EventPublisherFactory, KVEventsConfig

        # The ports were free when the test picked them; a loopback connection may hold one
        # for a moment since (an ephemeral port). A half-built publisher would keep the other
        # bound, so wait until both bind before SGLang's constructor tries.
        config = KVEventsConfig.from_cli(self.server_args.kv_events_config)
        deadline = time.monotonic() + wait_s
        while not all(map(_bindable, (config.endpoint, config.replay_endpoint))):
            if time.monotonic() > deadline:
                raise RuntimeError(f"KV event ports still busy after {wait_s:g} s: {config}")
            time.sleep(0.1)
        self.publisher = EventPublisherFactory.create(self.server_args.kv_events_config)
        return {"publisher": type(self.publisher).__name__}

    def op_kv_publish(
        self, events: list[dict[str, Any]], drop_live: bool = False, skip_seqs: int = 0
    ) -> dict[str, Any]:
        """One KVEventBatch. drop_live: it never reaches live subscribers (replay has it);
        skip_seqs: that many sequence numbers are used up first (batches lost for good)."""
        from sglang.srt.disaggregation import kv_events as kv

        kinds = {"BlockStored": kv.BlockStored, "BlockRemoved": kv.BlockRemoved}
        kinds["AllBlocksCleared"] = kv.AllBlocksCleared
        built = [kinds[e["type"]](**{k: v for k, v in e.items() if k != "type"}) for e in events]
        pub = self.publisher
        for _ in range(skip_seqs):
            next(pub._seq_gen)
        ts = time.time()  # as SchedulerKvEventsPublisher.publish_kv_events stamps a batch
        live = pub._pub
        if drop_live:
            pub._pub = _Unsent(live)
        try:
            pub.publish(kv.KVEventBatch(ts=ts, events=built))
            pub._event_queue.join()  # the publisher thread has sent (or dropped) it
        finally:
            pub._pub = live
        seq = pub._buffer[-1][0]
        return {"seq": seq, "ts": ts}

    def op_kv_radix(self, inserts: list[list[int]], evict_tokens: int) -> dict[str, Any]:
        """Inserts and an eviction on a fresh RadixCache with KV events on (page size as
        parsed); its events, taken as the scheduler takes them, go out as one batch."""
        import msgspec

        cache = self.RadixCache(
            self.CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=_FreeingAllocator(),
                page_size=self.server_args.page_size or 1,
                eviction_policy=self.server_args.radix_eviction_policy,
                enable_kv_cache_events=True,
            )
        )
        cache.take_events()  # the AllBlocksCleared of its construction (reset())
        for ids in inserts:
            value = self.torch.arange(len(ids), dtype=self.torch.int64)
            cache.insert(self.InsertParams(key=self.RadixKey(token_ids=ids), value=value))
        evicted = cache.evict(self.EvictParams(num_tokens=evict_tokens)).num_tokens_evicted
        events = cache.take_events()
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        ts = time.time()
        self.publisher.publish(KVEventBatch(ts=ts, events=events))
        self.publisher._event_queue.join()
        return {
            "seq": self.publisher._buffer[-1][0],
            "ts": ts,
            "evicted": evicted,
            "events": msgspec.to_builtins(events),
        }

    def op_kv_close(self) -> dict[str, Any]:
        if self.publisher is not None:
            self.publisher.shutdown()
            self.publisher = None
        return {}

    def close(self) -> None:
        self.op_kv_close()
        self.http.shutdown()
        self.http.server_close()


def _bindable(endpoint: str | None) -> bool:
    if not endpoint:
        return True
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZMQ binds
        try:
            sock.bind((host, int(port)))
        except OSError:
            return False
    return True


class _FreeingAllocator:
    """The KV pool allocator the radix cache frees evicted slots into (no memory here)."""

    device = "cpu"

    def free(self, indices: Any) -> None:
        pass

    def free_segment(self, indices: Any, start_pos: int = 0) -> None:
        pass


def main() -> None:
    out, sys.stdout = sys.stdout, sys.stderr  # SGLang's own prints must not corrupt replies

    def reply(doc: dict[str, Any]) -> None:
        out.write(json.dumps(doc, default=str) + "\n")
        out.flush()

    producer: Producer | None = None
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op == "init":
                producer = Producer(command["argv"])
                result = producer.op_info()
            elif op == "quit":
                break
            else:
                assert producer is not None, "send init first"
                result = getattr(producer, f"op_{op}")(**command)
        except Exception:
            reply({"ok": False, "error": traceback.format_exc()})
            continue
        reply({"ok": True, **result})
    if producer is not None:
        producer.close()
    _PROM_DIR.cleanup()
    sys.stderr.flush()
    # Skip interpreter teardown: SGLang's atexit hooks would shut every publisher down again,
    # a second each (ZmqEventPublisher.shutdown waits for a queue that never empties).
    os._exit(0)


if __name__ == "__main__":
    main()
