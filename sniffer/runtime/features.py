"""The production features of ``sparseety run``, built before the daemon that runs them.

The daemon itself only captures, runs the pipeline and hands every batch to
its recording chain. :func:`build_features` builds that chain from the
configuration (the same :meth:`RecordingChain.from_config` the replay command
uses) and what only a live process needs: database file permissions, the
Prometheus endpoint and the background workers. The daemon takes them at
construction (``Daemon(config, features=build_features(config, log))``): one
step, and this module does not know the daemon.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sniffer.llm.registry import TOKENIZERS_PARALLELISM
from sniffer.record.chain import RecordingChain
from sniffer.runtime.workers import (
    Periodic,
    limit_arenas,
    retention_worker,
    token_worker,
    trim_heap,
)

if TYPE_CHECKING:
    from sniffer.record.metrics import Metrics
    from sniffer.runtime.config import Config
    from sniffer.runtime.log import Log
    from sniffer.runtime.stats import DaemonStats

__all__ = ["TOKENIZERS_PARALLELISM", "Features", "Gauged", "build_features"]


class Gauged(Protocol):
    """What the once-a-second gauges read of the daemon running the features."""

    stats: DaemonStats

    @property
    def open_connections(self) -> int: ...

    @property
    def open_streams(self) -> int: ...

    @property
    def queue_depth(self) -> int: ...

    def reassembly_counts(self) -> dict[str, int]: ...


@dataclass
class Features:
    """What :func:`build_features` built for a daemon (for the daemon, tests and the CLI).

    The daemon binds ``chain``'s error hook and clock to its own, calls every
    ``ticks`` hook about once a second, :meth:`start` once capture is active
    and the database open at this code's schema, and :meth:`stop` at shutdown.
    """

    chain: RecordingChain
    metrics: Metrics | None = None
    metrics_server: Any = None  # sniffer.record.metrics.MetricsServer
    otlp: Any = None  # sniffer.record.otlp.OtlpExporter
    workers: list[Periodic] = dataclasses.field(default_factory=list)
    ticks: list[Callable[[Gauged], None]] = dataclasses.field(default_factory=list)

    @property
    def sampler(self) -> Any:
        return self.chain.sampler

    @property
    def redactor(self) -> Any:
        return self.chain.redactor

    @property
    def collector(self) -> Any:
        return self.chain.collector

    def start(self) -> None:
        """Start the workers: the daemon calls this once it has opened the
        database at this code's schema (a newer schema is refused with ONE
        line, no worker's after it) and capture is active."""
        for w in self.workers:
            w.start()

    def stop(self) -> None:
        """Stop the workers (a no-op for those never started), then close the
        OTLP exporter (after the workers: the last token figures reach it) and
        the metrics server."""
        for w in self.workers:
            w.stop()
        if self.otlp is not None:
            self.otlp.close()
        if self.metrics_server is not None:
            self.metrics_server.close()


def build_features(cfg: Config, log: Log) -> Features:
    """The production features ``cfg`` asks for, for a daemon to run:

    * database file permissions (0600 / 0640 with a group; refuse a
      world-readable file unless allowed) — before anything opens it;
    * the recording chain (``RecordingChain.from_config``): metrics and the
      token collector as observers (they see the events as captured), then
      sampling and redaction as transforms; the daemon attaches the writer,
      and observers and transforms it is given later come after these;
    * Prometheus metrics, served on ``metrics_listen`` (loopback unless
      ``metrics_public``), fed by the chain and, once a second, by the
      daemon's counters;
    * the token pass: a worker thread tokenizes closed streams in batches (off
      the capture path) and writes their token rows, feeding metrics and the
      sampler's boost;
    * retention: a worker deleting old streams in small batches;
    * OpenTelemetry export (``otlp_endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``):
      an observer of the chain (see :mod:`sniffer.record.otlp`), closed after
      the workers so that the last token figures reach it. Raises
      ``OtlpUnavailable`` (saying what to install) without the SDK.
    """
    from sniffer.store.files import db_path, prepare_db_file
    from sniffer.store.lite import check_writable

    limit_arenas()  # before any of the daemon's threads start
    if cfg.tokens:
        # Before any thread starts too (the environment is not thread-safe).
        # The token pass is background work sharing the cores with the
        # capture: HF tokenizers' rayon pool would encode each batch on every
        # core, its workers spinning between batches, for ~10 % more CPU than
        # one thread (bench/bench_live.py --only memory: 0.73 s against
        # 0.66 s of encoding for 1,000 streams). Set by the user, it is kept.
        os.environ.setdefault(TOKENIZERS_PARALLELISM, "false")
    path = db_path(cfg.database)
    if path is not None:
        if os.path.lexists(path):
            check_writable(path)  # one line, before prepare_db_file's chmod fails
        prepare_db_file(
            path, group=cfg.db_group or None, allow_world_readable=cfg.allow_world_readable
        )

    metrics = None
    metrics_server = None
    ticks: list[Callable[[Gauged], None]] = []
    if cfg.metrics:
        from sniffer.record.metrics import Metrics

        metrics = Metrics(max_models=cfg.metrics_max_models)
        host, port = _host_port(cfg.metrics_listen)
        metrics_server = metrics.serve(host, port, allow_public=cfg.metrics_public)
        log("info", "metrics-serving", url=metrics_server.url)
        ticks.append(_gauges(metrics))

    otlp = _otlp(cfg, metrics, log)
    try:
        chain = RecordingChain.from_config(cfg, metrics=metrics, otlp=otlp)
    except BaseException:
        if otlp is not None:
            otlp.close()
        raise
    f = Features(chain, metrics=metrics, metrics_server=metrics_server, otlp=otlp, ticks=ticks)
    if not cfg.redact:
        log("warning", "redaction-off", note="prompts and outputs are stored as captured")
    if chain.tokens is not None:
        # A bad tokenizer config fails at start, with its message; the built-in
        # default loads at the first token pass (in the token thread), not
        # before the capture opens (issue #16: start-up).
        chain.tokens.preload_configured()
        trim_heap()  # a tokenizer's JSON parse leaves ~20 MB freed but mapped
        f.workers.append(token_worker(chain, cfg.database, log))

    if cfg.retention_days > 0:
        f.workers.append(retention_worker(cfg, log))
    return f


def _otlp(cfg: Any, metrics: Metrics | None, log: Any) -> Any:
    """The OTLP exporter ``cfg`` asks for (flag/config key, else the standard
    environment variables), or None."""
    from sniffer.record.otlp_setup import resolve_endpoint

    endpoint = resolve_endpoint(cfg.otlp_endpoint)
    if not endpoint:
        return None
    from sniffer.record.otlp import OtlpExporter, OtlpOptions, resolve_headers

    options = OtlpOptions(
        endpoint=endpoint,
        headers=resolve_headers(cfg.otlp_headers),
        node=cfg.node,
        chunk_events=cfg.otlp_chunk_events,
        queue_size=cfg.otlp_queue_size,
        timeout=cfg.otlp_timeout,
        metrics_interval=cfg.otlp_metrics_interval,
    )
    exporter = OtlpExporter(options, log=log, metrics=metrics, wait_tokens=cfg.tokens)
    log(
        "info",
        "otlp-exporting",
        endpoint=endpoint,
        node=cfg.node,
        chunk_events=cfg.otlp_chunk_events,
        queue_size=cfg.otlp_queue_size,
    )
    return exporter


def _host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def _gauges(metrics: Metrics) -> Callable[[Gauged], None]:
    """The once-a-second hook that copies the daemon's counters into ``metrics``."""
    last = {"items": 0, "kernel": 0, "queue": 0}
    tcp: dict[str, int] = {}

    def gauges(daemon: Gauged) -> None:
        s = daemon.stats
        metrics.add_packets(s.items - last["items"])
        metrics.add_kernel_drops(s.kernel_dropped - last["kernel"])
        metrics.add_queue_drops(s.queue_dropped - last["queue"])
        last.update(items=s.items, kernel=s.kernel_dropped, queue=s.queue_dropped)
        counts = daemon.reassembly_counts()
        delta = {}
        for k, v in counts.items():
            prev = tcp.get(k, 0)
            delta[k] = v - prev if v >= prev else v  # below: a new pipeline, from zero
        metrics.add_reassembly(delta)
        tcp.clear()
        tcp.update(counts)
        metrics.set_open(daemon.open_connections, daemon.open_streams)
        metrics.set_queue_depth(daemon.queue_depth)

    return gauges
