"""The daemon's configuration: TOML file, CLI overrides, validation.

Layout (every key optional; the values shown are the defaults)::

    log_level = "info"            # debug, info, warning, error
    node = "<host name>"          # this sidecar's name, stored on every row (--node)

    [capture]
    interface = "lo"
    ports = [8000]                # server ports; labelled ports are captured too
    backend = "packet"            # "packet" (AF_PACKET ring) or "ebpf" (syscalls)
    pids = []                     # ebpf: only these processes (thread-group ids) ...
    comms = []                    # ... or these process names (15 bytes at most)
    queue_size = 1024             # capture → pipeline queue, in BATCHES of segments
    ring_blocks = 32              # packet: TPACKET_V3 ring blocks ...
    block_size = 524288           # ... of this many bytes (a multiple of the page size)
    idle_timeout = 300.0          # seconds without a packet before a connection is closed
    handover = 1.0                # seconds the capture thread gathers packets per batch at most

    [store]
    database = "sqlite:///./sparseety.db"   # SQLAlchemy URL or a file path
    flush_interval = 1.0          # seconds between batched writes at most
    batch_size = 5000             # rows per write at most

    [labels]                      # server port → label stored on every stream
    8000 = "baseline"
    8001 = "sparse"

    [metrics]                     # Prometheus exposition
    enabled = true
    listen = "127.0.0.1:9464"     # loopback only unless public = true
    public = false
    max_models = 20               # distinct model labels per server label; the rest → "other"

    [sampling]                    # which streams keep their chunk text (summaries always)
    rate = 1.0                    # 0–1, decided per stream from its identity
    boost_threshold = 0           # anomalies in boost_window that raise the rate to 1 (0: off)
    boost_window = 60.0
    boost_period = 600.0

    [redaction]                   # applied before anything is written
    enabled = true
    patterns = []                 # extra: [{ name = "APIKEY", regex = "sk-[A-Za-z0-9]{20,}" }]

    [retention]
    days = 0                      # delete streams older than this many days (0: keep all)
    batch = 500                   # streams per delete transaction
    interval = 60.0               # seconds between prune runs

    [tokens]                      # tokenization off the capture path
    enabled = true
    default = ""                  # tokenizer when no pattern matches ("": DeepSeek-V4)

    [tokenizers]                  # model (exact or glob) → dir, tokenizer.json, .gguf, hub id
    "deepseek-*" = "/models/deepseek/tokenizer.json"
    "gemma-*" = "/models/gemma-3-270m-q4_k_m.gguf"

    [limits]                      # Content-Encoding (gzip/deflate) caps per exchange
    max_decoded_bytes = 33554432  # decoded body bytes at most (32 MiB)
    max_expansion_ratio = 100.0   # decoded/encoded at most, past the first MiB
    [otlp]                        # OpenTelemetry export (needs: pip install 'sparseety[otlp]')
    endpoint = ""                 # OTLP/HTTP base URL, e.g. "http://collector:4318"
                                  # ("": OTEL_EXPORTER_OTLP_ENDPOINT if set, else off)
    headers = {}                  # sent with every export (over OTEL_EXPORTER_OTLP_HEADERS)
    chunk_events = false          # one span event per chunk
    queue_size = 4096             # closed streams waiting for export; beyond: dropped, counted
    timeout = 10.0                # seconds per export, retries included
    metrics_interval = 10.0       # seconds between metric exports
    [grpc]                        # gRPC calls over HTTP/2 (see sniffer.core.grpc)
    proto = ""                    # descriptor set (protoc --include_imports -o FILE.pb): decode
    text_outputs = ["text_output", "output", "OUTPUT0"]  # KServe v2 text tensor names, in order

    [files]
    group = ""                    # database files 0640 with this group (default 0600)
    allow_world_readable = false  # refuse to start on a world-readable database file

The keys of ``[capture]`` and ``[store]`` (and ``log_level``) may also be
written flat, at the top level; a key set both ways is an error. The feature
tables (``[metrics]`` … ``[files]``) only take the keys shown. Any other
top-level table or key is kept, unparsed, in ``Config.extra``. An unknown key
*inside* a known table is an error that names it.

Every option is declared once, as a field of :class:`Config` (:func:`option`:
its type, default, TOML table and key, and its ``sparseety run`` :class:`Flag`
with the help): the tables read here, ``--print-config`` (:func:`render_toml`),
the reload rule (:data:`RESTART_KEYS`) and the click options
(``sniffer.cli.run``) are derived from :data:`OPTIONS`.

Loading never exits: every problem is a :class:`ConfigError` whose message is
one line (the CLI prints it and exits with code 2).
"""

from __future__ import annotations

import mmap
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from sniffer.core.coding import MAX_DECODED_BYTES, MAX_EXPANSION_RATIO

__all__ = [
    "BACKENDS",
    "DEFAULT_DATABASE",
    "LOG_LEVELS",
    "OPTIONS",
    "RESTART_KEYS",
    "Config",
    "ConfigError",
    "Flag",
    "Option",
    "load_config",
    "parse_config",
    "render_toml",
]

BACKENDS = ("packet", "ebpf")
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_DATABASE = "sqlite:///./sparseety.db"
#: The tables whose keys may also be written flat, at the top level ("" is the top level).
FLAT_TABLES = ("capture", "store", "")


@dataclass(frozen=True)
class Flag:
    """How an option is given to ``sparseety run`` (the click option is made from it)."""

    name: str  # "--interface"
    help: str = ""
    short: str | None = None  # "-i"
    metavar: str | None = None
    multiple: bool = False  # repeatable: every value is kept, in order
    #: a switch: giving it sets the option to this value (``--no-metrics`` → False)
    sets: Any = None
    #: ``NAME=VALUE`` values of this form ("PORT=NAME"), split by the CLI's one parser;
    #: ``header``: the value may be empty and the name loses its spaces
    form: str | None = None
    header: bool = False
    #: the ``[default: …]`` of the help: None → the default itself, "" → none
    shown: str | None = None
    #: a number in this closed range
    range: tuple[float, float] | None = None
    #: the option's value from the flag's text (``--retention 30d`` → days)
    convert: Callable[[str], Any] | None = None

    @property
    def dest(self) -> str:
        """The flag's parameter name (``--no-metrics`` → ``no_metrics``)."""
        return self.name.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Option:
    """One option of the daemon's configuration, defined once: its :class:`Config`
    field (name, type, default), its TOML place, its ``sparseety run`` flag.
    :data:`OPTIONS` lists them in field order, from :class:`Config`'s fields."""

    name: str  # the Config field
    table: str  # its TOML table ("" the top level; "labels", "tokenizers": the whole table)
    key: str  # its key in that table
    kind: str  # bool, int, float, str, ints, strs, labels, pairs
    default: Any  # None when given by a factory
    choices: tuple[str, ...] = ()  # str: one of these (written in any case)
    #: pairs: the names of the two strings in TOML's list-of-tables form, and how
    #: ``--print-config`` writes them ("list": ``[{a = …, b = …}]``, "table": ``{A = B}``)
    pair: tuple[str, str] = ("", "")
    render: str = "table"
    flag: Flag | None = None
    restart: bool = False  # a reload (SIGHUP) cannot change it: logged, the old value kept

    @property
    def dest(self) -> str:
        """The name of the ``sparseety run`` parameter that carries it: the
        field's, or the flag's for a switch or a converted value."""
        flag = self.flag
        if flag is not None and (flag.sets is not None or flag.convert is not None):
            return flag.dest
        return self.name


_KINDS = {bool: "bool", int: "int", float: "float", str: "str"}


def option(
    table: str,
    default: Any = None,
    *,
    key: str | None = None,
    factory: Callable[[], Any] | None = None,
    kind: str | None = None,
    choices: tuple[str, ...] = (),
    pair: tuple[str, str] = ("", ""),
    render: str = "table",
    flag: Flag | None = None,
    restart: bool = False,
) -> Any:
    """A :class:`Config` field that is an :class:`Option` (``key``: the field's
    name when not given; ``kind``: the default's type when not given)."""
    meta = {
        "table": table,
        "key": key,
        "kind": kind or _KINDS[type(default)],
        "default": default,
        "choices": choices,
        "pair": pair,
        "render": render,
        "flag": flag,
        "restart": restart,
    }
    if factory is not None:
        return field(default_factory=factory, metadata={"option": meta})
    return field(default=default, metadata={"option": meta})


def _retention_days(text: str) -> float:
    from sniffer.store.retention import parse_age

    return parse_age(text) / 86400.0


def _text_outputs() -> tuple[str, ...]:
    # the gRPC parser's own default, imported when a Config is made: importing
    # sniffer.core.grpc loads the event types, which ``run --help`` does not need
    from sniffer.core.grpc import TEXT_OUTPUTS

    return TEXT_OUTPUTS


class ConfigError(Exception):
    """The configuration is unusable; the message is one line naming the problem."""


@dataclass(frozen=True)
class Config:
    """The effective daemon configuration (defaults = ``sparseety run`` with no options).

    Every field but ``extra`` and ``source`` is an :class:`Option`: the TOML
    tables, the ``sparseety run`` flags and ``--print-config`` are derived from
    these declarations (their order is the order of the flags and, table by
    table, of ``--print-config``).
    """

    interface: str = option(
        "capture", "lo", flag=Flag("--interface", "Interface to capture on.", short="-i")
    )
    ports: tuple[int, ...] = option(
        "capture",
        (8000,),
        kind="ints",
        flag=Flag("--port", "Server port (repeat).", multiple=True, shown="8000"),
    )
    labels: Mapping[int, str] = option(
        "labels",
        key="",
        factory=dict,
        kind="labels",
        flag=Flag(
            "--label",
            "Label stored on every stream whose server port is PORT (repeat); PORT is captured.",
            multiple=True,
            form="PORT=NAME",
        ),
    )
    backend: str = option(
        "capture",
        "packet",
        choices=BACKENDS,
        restart=True,
        flag=Flag(
            "--backend",
            "packet: AF_PACKET ring + kernel BPF filter; ebpf: syscall tracing.",
        ),
    )
    pids: tuple[int, ...] = option(
        "capture",
        (),
        kind="ints",
        flag=Flag("--pid", "ebpf: only this process (repeat).", multiple=True),
    )
    comms: tuple[str, ...] = option(
        "capture",
        (),
        kind="strs",
        flag=Flag("--comm", "ebpf: only this process name (repeat).", multiple=True),
    )
    database: str = option(
        "store",
        DEFAULT_DATABASE,
        restart=True,
        flag=Flag(
            "--db",
            "SQLite file or SQLAlchemy URL.",
            shown=f"$SPARSEETY_DB, else the config file's, else {DEFAULT_DATABASE}",
        ),
    )
    flush_interval: float = option(
        "store", 1.0, flag=Flag("--flush-interval", "Seconds between writes at most.")
    )
    batch_size: int = option("store", 5000, flag=Flag("--batch-size", "Rows per write at most."))
    queue_size: int = option(
        "capture",
        1024,
        flag=Flag("--queue-size", "Capture→pipeline queue length, in batches."),
    )
    # 16 MiB, all resident (counted in RSS): lossless at 40k ev/s on 64
    # connections (bench_live.py sweep); 32 MiB cost 16 MB of RSS for nothing there
    ring_blocks: int = option("capture", 32, flag=Flag("--ring-blocks", "packet: ring blocks."))
    block_size: int = option(
        "capture", 1 << 19, flag=Flag("--block-size", "packet: bytes per ring block.")
    )
    idle_timeout: float = option(
        "capture",
        300.0,
        flag=Flag("--idle-timeout", "Seconds before an idle connection closes."),
    )
    # Each batch wakes the processing thread, whose state has gone cold since
    # the last one: gathering 1 s instead of one ring block (250 ms) cut the
    # processing thread's CPU by ~20 % at 5,000 events/s (the live benchmark's
    # traffic offline); a busy capture is handed over every few blocks anyway
    # (capture_thread.HANDOVER_POLLS).
    handover: float = option(
        "capture",
        1.0,
        flag=Flag(
            "--handover",
            "Seconds the capture thread gathers packets before handing them to the "
            "pipeline, at most (0: at once; lower = fresher rows, more CPU).",
        ),
    )
    log_level: str = option("", "info", choices=LOG_LEVELS, flag=Flag("--log-level"))
    #: this sidecar's name, stored on every connection, stream and error row
    node: str = option(
        "",
        factory=socket.gethostname,
        kind="str",
        restart=True,
        flag=Flag(
            "--node",
            "This sidecar's name, stored on every row (readers filter by it with --node); "
            "for many sidecars writing to one database.",
            metavar="NAME",
            shown="the host name",
        ),
    )
    # [metrics]
    metrics: bool = option(
        "metrics",
        True,
        key="enabled",
        flag=Flag("--no-metrics", "Do not serve /metrics.", sets=False),
    )
    metrics_listen: str = option(
        "metrics",
        "127.0.0.1:9464",
        key="listen",
        flag=Flag("--metrics-listen", "Prometheus /metrics.", metavar="HOST:PORT"),
    )
    metrics_public: bool = option(
        "metrics",
        False,
        key="public",
        flag=Flag("--metrics-public", "Allow a non-loopback --metrics-listen address.", sets=True),
    )
    metrics_max_models: int = option("metrics", 20, key="max_models")
    # [sampling]
    sample_rate: float = option(
        "sampling",
        1.0,
        key="rate",
        flag=Flag(
            "--sample-rate",
            "Share of streams whose chunk text is stored (summaries always).",
            range=(0, 1),
        ),
    )
    boost_threshold: int = option("sampling", 0)
    boost_window: float = option("sampling", 60.0)
    boost_period: float = option("sampling", 600.0)
    # [redaction]
    redact: bool = option(
        "redaction",
        True,
        key="enabled",
        flag=Flag("--no-redact", "No PII redaction (credentials are still removed).", sets=False),
    )
    redact_patterns: tuple[tuple[str, str], ...] = option(  # (name, regex)
        "redaction",
        (),
        key="patterns",
        kind="pairs",
        pair=("name", "regex"),
        render="list",
        flag=Flag(
            "--redact-pattern",
            "Also replace REGEX matches by <NAME> (repeat).",
            multiple=True,
            form="NAME=REGEX",
        ),
    )
    # [retention]
    retention_days: float = option(
        "retention",
        0.0,
        key="days",
        flag=Flag(
            "--retention",
            "Delete streams older than AGE (e.g. 30d).",
            metavar="AGE",
            convert=_retention_days,
            shown="",
        ),
    )
    retention_batch: int = option("retention", 500, key="batch")
    retention_interval: float = option("retention", 60.0, key="interval")
    # [tokens] / [tokenizers]
    tokens: bool = option(
        "tokens",
        True,
        key="enabled",
        flag=Flag("--no-tokens", "Do not tokenize streams.", sets=False),
    )
    tokenizers: tuple[tuple[str, str], ...] = option(  # (model glob, source)
        "tokenizers",
        (),
        key="",
        kind="pairs",
        pair=("pattern", "source"),
        flag=Flag(
            "--tokenizer",
            "Tokenizer for models matching PATTERN: a dir, tokenizer.json or cached hub id "
            "(repeat).",
            multiple=True,
            form="PATTERN=SOURCE",
        ),
    )
    default_tokenizer: str = option(
        "tokens",
        "",
        key="default",
        flag=Flag("--default-tokenizer", metavar="SOURCE", shown="DeepSeek-V4"),
    )
    # [files]
    db_group: str = option(
        "files",
        "",
        key="group",
        flag=Flag("--db-group", "Database files 0640 with this group.", metavar="GROUP"),
    )
    allow_world_readable: bool = option(
        "files",
        False,
        flag=Flag(
            "--allow-world-readable",
            "Start even if the database file is world-readable.",
            sets=True,
        ),
    )
    # [limits]: Content-Encoding caps per exchange, the HTTP parsers' own
    max_decoded_bytes: int = option("limits", MAX_DECODED_BYTES)
    max_expansion_ratio: float = option("limits", float(MAX_EXPANSION_RATIO))
    # [otlp]
    otlp_endpoint: str = option(  # "": OTEL_EXPORTER_OTLP_ENDPOINT, else off
        "otlp",
        "",
        key="endpoint",
        restart=True,
        flag=Flag(
            "--otlp-endpoint",
            "Export spans and GenAI metrics over OTLP/HTTP to this collector base URL "
            "(e.g. http://127.0.0.1:4318); default: $OTEL_EXPORTER_OTLP_ENDPOINT, else off. "
            "Needs: pip install 'sparseety[otlp]'.",
            metavar="URL",
        ),
    )
    otlp_headers: tuple[tuple[str, str], ...] = option(  # (name, value)
        "otlp",
        (),
        key="headers",
        kind="pairs",
        pair=("name", "value"),
        restart=True,
        flag=Flag(
            "--otlp-header",
            "Header sent with every OTLP export (repeat; adds to $OTEL_EXPORTER_OTLP_HEADERS).",
            multiple=True,
            form="NAME=VALUE",
            header=True,
        ),
    )
    otlp_chunk_events: bool = option(
        "otlp",
        False,
        key="chunk_events",
        restart=True,
        flag=Flag(
            "--otlp-chunk-events", "One span event per streamed chunk (off by default).", sets=True
        ),
    )
    otlp_queue_size: int = option(
        "otlp",
        4096,
        key="queue_size",
        restart=True,
        flag=Flag(
            "--otlp-queue-size",
            "Closed streams waiting for OTLP export; beyond it they are dropped and counted.",
        ),
    )
    otlp_timeout: float = option("otlp", 10.0, key="timeout", restart=True)
    otlp_metrics_interval: float = option("otlp", 10.0, key="metrics_interval", restart=True)
    # [grpc]
    grpc_proto: str = option(
        "grpc",
        "",
        key="proto",
        flag=Flag(
            "--proto",
            "Protobuf descriptor set: decode the messages of the gRPC methods it describes.",
            metavar="FILE.pb",
        ),
    )
    grpc_text_outputs: tuple[str, ...] = option(
        "grpc", key="text_outputs", factory=_text_outputs, kind="strs"
    )
    #: unknown top-level tables and keys
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the file this came from, if any (SIGHUP re-reads it)
    source: str | None = None

    @property
    def capture_ports(self) -> tuple[int, ...]:
        """Ports the capture filter selects: ``ports`` plus every labelled port."""
        return tuple(sorted(set(self.ports) | set(self.labels)))

    def with_overrides(self, overrides: Mapping[str, Any]) -> Config:
        """A copy with the given options replaced (``None`` values are ignored), validated."""
        names = {f.name for f in fields(self)}
        changes: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in names or key in ("extra", "source"):
                raise ConfigError(f"unknown option {key!r}")
            if value is None:
                continue
            changes[key] = _coerce(key, value, "option")
        cfg = replace(self, **changes)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise :class:`ConfigError` on the first invalid value."""
        self._check_limits()
        self._check_capture()
        self._check_store_and_buffers()
        self._check_identity()
        self._check_features()
        self._check_export()

    def _check_limits(self) -> None:
        """Content-Encoding caps."""
        if self.max_decoded_bytes < 1:
            raise ConfigError("limits.max_decoded_bytes: must be at least 1")
        if not self.max_expansion_ratio >= 1:
            raise ConfigError("limits.max_expansion_ratio: must be at least 1")

    def _check_capture(self) -> None:
        """What is captured: interface, ports, processes, labels."""
        iface = self.interface
        if not iface or len(iface) >= 16 or "/" in iface or any(c.isspace() for c in iface):
            raise ConfigError(f"interface: invalid interface name {iface!r}")
        for p in (*self.ports, *self.labels):
            if not 0 < p < 65536:
                raise ConfigError(f"ports: port {p} out of range 1-65535")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend: {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if not self.capture_ports and (self.backend == "packet" or not (self.pids or self.comms)):
            raise ConfigError("ports: at least one server port is needed")
        for pid in self.pids:
            if pid <= 0:
                raise ConfigError(f"pids: {pid} is not a process id")
        for comm in self.comms:
            if not comm or len(comm.encode()) > 15:
                raise ConfigError(f"comms: {comm!r} must be 1 to 15 bytes")
        if (self.pids or self.comms) and self.backend != "ebpf":
            raise ConfigError("pids/comms select processes: they need backend = 'ebpf'")
        for name, label in self.labels.items():
            if not label:
                raise ConfigError(f"labels: empty label for port {name}")

    def _check_store_and_buffers(self) -> None:
        """The database, the writes and the capture buffers."""
        if not self.database:
            raise ConfigError("database: empty")
        if not 0 < self.flush_interval <= 3600:
            raise ConfigError(f"flush_interval: {self.flush_interval} out of range (0, 3600]")
        if not 1 <= self.batch_size <= 10_000_000:
            raise ConfigError(f"batch_size: {self.batch_size} out of range 1-10000000")
        if not 1 <= self.queue_size <= 1_000_000:
            raise ConfigError(f"queue_size: {self.queue_size} out of range 1-1000000")
        if not 1 <= self.ring_blocks <= 65536:
            raise ConfigError(f"ring_blocks: {self.ring_blocks} out of range 1-65536")
        page = mmap.PAGESIZE
        if self.block_size < 1 << 16 or self.block_size % page or self.block_size > 1 << 30:
            raise ConfigError(
                f"block_size: {self.block_size} must be a multiple of {page} "
                "between 65536 and 1073741824"
            )
        if not 0 <= self.handover <= 10:
            raise ConfigError(f"handover: {self.handover} out of range [0, 10]")
        if not 0 < self.idle_timeout <= 86400 * 7:
            raise ConfigError(f"idle_timeout: {self.idle_timeout} out of range (0, 604800]")

    def _check_identity(self) -> None:
        """This sidecar's name and its log level."""
        if not self.node or len(self.node) > 255 or not self.node.isprintable():
            raise ConfigError(f"node: {self.node!r} must be 1 to 255 printable characters")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"log_level: {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}"
            )

    def _check_features(self) -> None:
        """Metrics, sampling, redaction and retention."""
        if self.metrics:
            host, _, port = self.metrics_listen.rpartition(":")
            if not host or not port.isdigit() or not 0 <= int(port) < 65536:
                raise ConfigError(f"metrics listen: {self.metrics_listen!r} is not HOST:PORT")
        if not 1 <= self.metrics_max_models <= 10_000:
            raise ConfigError(f"metrics max_models: {self.metrics_max_models} out of range")
        if not 0.0 <= self.sample_rate <= 1.0:
            raise ConfigError(f"sampling rate: {self.sample_rate} is not between 0 and 1")
        if self.boost_threshold < 0 or self.boost_window <= 0 or self.boost_period <= 0:
            raise ConfigError("sampling: boost_threshold >= 0, boost_window and boost_period > 0")
        for pname, regex in self.redact_patterns:
            try:
                re.compile(regex)
            except re.error as exc:
                raise ConfigError(f"redaction pattern {pname!r}: bad regex: {exc}") from None
        if self.retention_days < 0 or self.retention_batch < 1 or self.retention_interval <= 0:
            raise ConfigError("retention: days >= 0, batch >= 1 and interval > 0")

    def _check_export(self) -> None:
        """OTLP export and gRPC decoding."""
        ep = self.otlp_endpoint
        if ep and not (ep.startswith("http://") or ep.startswith("https://")):
            raise ConfigError(f"otlp endpoint: {ep!r} is not an http:// or https:// URL")
        if not 1 <= self.otlp_queue_size <= 10_000_000:
            raise ConfigError(f"otlp queue_size: {self.otlp_queue_size} out of range")
        if not 0 < self.otlp_timeout <= 600 or not 0 < self.otlp_metrics_interval <= 3600:
            raise ConfigError("otlp: timeout in (0, 600], metrics_interval in (0, 3600]")
        if not self.grpc_text_outputs or not all(self.grpc_text_outputs):
            raise ConfigError("grpc text_outputs: at least one non-empty tensor name")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ports"] = list(self.ports)
        d["labels"] = {str(k): v for k, v in sorted(self.labels.items())}
        d["pids"] = list(self.pids)
        d["comms"] = list(self.comms)
        d["grpc_text_outputs"] = list(self.grpc_text_outputs)
        d["redact_patterns"] = [list(p) for p in self.redact_patterns]
        d["tokenizers"] = [list(p) for p in self.tokenizers]
        d["otlp_headers"] = [list(p) for p in self.otlp_headers]
        d["extra"] = dict(self.extra)
        return d


def _options() -> tuple[Option, ...]:
    out = []
    for f in fields(Config):
        meta = f.metadata.get("option")
        if meta is not None:
            key = meta["key"] if meta["key"] is not None else f.name
            out.append(Option(name=f.name, **{**meta, "key": key}))
    return tuple(out)


#: Every option, in :class:`Config`'s field order.
OPTIONS = _options()
_OPTION = {o.name: o for o in OPTIONS}
#: Keys of the tables that may be written flat: table → keys ("" = top level).
SECTIONS: dict[str, tuple[str, ...]] = {
    sec: tuple(o.key for o in OPTIONS if o.table == sec) for sec in FLAT_TABLES
}
_SECTION_OF = {key: sec for sec, keys in SECTIONS.items() for key in keys}
#: Feature tables: key inside the table → Config field (the tables in field order).
TABLES: dict[str, dict[str, str]] = {}
for _o in OPTIONS:
    if _o.table not in FLAT_TABLES and _o.key:
        TABLES.setdefault(_o.table, {})[_o.key] = _o.name
del _o
#: Options a reload cannot change (logged, the old value kept).
RESTART_KEYS = tuple(o.name for o in OPTIONS if o.restart)


# ---------------------------------------------------------------------- coercion


def _int(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise ConfigError(f"{where} {key}: expected an integer, got {value!r}")
    return value


def _float(key: str, value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where} {key}: expected a number, got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise ConfigError(f"{where} {key}: expected a number, got {value!r}")


def _str(key: str, value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} {key}: expected a string, got {value!r}")
    return value


def _list(key: str, value: Any, where: str) -> list[Any]:
    if isinstance(value, list | tuple):
        return list(value)
    return [value]  # a single port/pid/comm is accepted as a one-element list


def _labels(value: Any, where: str) -> dict[int, str]:
    if not isinstance(value, Mapping):
        raise ConfigError(f'{where} labels: expected a table of PORT = "label"')
    out: dict[int, str] = {}
    for k, v in value.items():
        port = str(k).strip()
        if not port.isdigit():
            raise ConfigError(f"{where} labels: key {k!r} is not a port number")
        if not isinstance(v, str):
            raise ConfigError(f"{where} labels: label of port {port} must be a string")
        out[int(port)] = v
    return out


def _bool(key: str, value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ConfigError(f"{where} {key}: expected true or false, got {value!r}")


def _pairs(key: str, value: Any, where: str, a: str, b: str) -> tuple[tuple[str, str], ...]:
    """A table {A: B} or a list of {a = …, b = …} tables → ((A, B), …)."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, list | tuple):
        items = []
        for item in value:
            if isinstance(item, Mapping) and set(item) == {a, b}:
                items.append((item[a], item[b]))
            elif isinstance(item, list | tuple) and len(item) == 2:
                items.append((item[0], item[1]))
            else:
                raise ConfigError(f"{where} {key}: each entry needs {a} and {b}")
    else:
        raise ConfigError(f"{where} {key}: expected a table or a list")
    out = []
    for k, v in items:
        if not isinstance(k, str) or not isinstance(v, str) or not k or not v:
            raise ConfigError(f"{where} {key}: {k!r} = {v!r} must be two non-empty strings")
        out.append((k, v))
    return tuple(out)


def _coerce(key: str, value: Any, where: str) -> Any:
    opt = _OPTION[key]
    kind = opt.kind
    if kind == "bool":
        return _bool(key, value, where)
    if kind == "int":
        return _int(key, value, where)
    if kind == "float":
        return _float(key, value, where)
    if kind == "pairs":
        return _pairs(key, value, where, *opt.pair)
    if kind == "ints":
        return tuple(_int(key, v, where) for v in _list(key, value, where))
    if kind == "strs":
        return tuple(_str(key, v, where) for v in _list(key, value, where))
    if kind == "labels":
        return _labels(value, where)
    value = _str(key, value, where)
    return value.lower() if opt.choices else value


# ---------------------------------------------------------------------- parsing


def parse_config(data: Mapping[str, Any], source: str | None = None) -> Config:
    """Build a validated :class:`Config` from parsed TOML (a dict)."""
    where = source or "config"
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}

    def put(key: str, value: Any, place: str) -> None:
        if key in values:
            raise ConfigError(f"{where}: {key!r} is set twice (flat and in a table)")
        values[key] = _coerce(key, value, f"{where} [{place}]" if place else where)

    for top, value in data.items():
        if top in ("capture", "store"):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: [{top}] must be a table")
            for key, v in value.items():
                if _SECTION_OF.get(key) != top:
                    raise ConfigError(f"{where}: unknown key {key!r} in [{top}]")
                put(key, v, top)
        elif top == "labels":
            if "labels" in values:
                raise ConfigError(f"{where}: 'labels' is set twice")
            values["labels"] = _labels(value, f"{where} [labels]")
        elif top == "tokenizers":
            values["tokenizers"] = _coerce("tokenizers", value, f"{where} [tokenizers]")
        elif top in TABLES:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: [{top}] must be a table")
            for key, v in value.items():
                name = TABLES[top].get(key)
                if name is None:
                    raise ConfigError(f"{where}: unknown key {key!r} in [{top}]")
                put(name, v, top)
        elif top in _SECTION_OF:
            put(top, value, "")
        else:
            extra[top] = value
    try:
        cfg = Config(**values, extra=extra, source=source)
        cfg.validate()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return cfg


def load_config(path: str | Path | None = None) -> Config:
    """The defaults (``path`` None) or the TOML file at ``path``, validated."""
    if path is None:
        return Config()
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    import tomllib  # only for a config file (~3 ms of run's start-up)

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None
    return parse_config(data, source=str(p))


# ---------------------------------------------------------------------- rendering


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        out = value.replace("\\", "\\\\").replace('"', '\\"')
        out = "".join(c if c >= " " else f"\\u{ord(c):04x}" for c in out)
        return f'"{out}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return _toml_value(str(value))


def _key(k: Any) -> str:
    s = str(k)
    if s and all(c.isalnum() or c in "-_" for c in s):
        return s
    return _toml_value(s)


def render_toml(cfg: Config) -> str:
    """The effective configuration as a TOML document (what ``--print-config`` shows).

    It parses back into an equal configuration (``source`` aside).
    """
    lines = [f"{key} = {_toml_value(getattr(cfg, key))}" for key in SECTIONS[""]]
    lines.append("")
    for sec in ("capture", "store"):
        lines.append(f"[{sec}]")
        for key in SECTIONS[sec]:
            lines.append(f"{key} = {_toml_value(getattr(cfg, key))}")
        lines.append("")
    lines.append("[labels]")
    for port, label in sorted(cfg.labels.items()):
        lines.append(f"{port} = {_toml_value(label)}")
    lines.append("")
    for table, keys in TABLES.items():
        lines.append(f"[{table}]")
        for key, name in keys.items():
            value = getattr(cfg, name)
            opt = _OPTION[name]
            if opt.kind == "pairs":
                a, b = opt.pair
                value = [{a: x, b: y} for x, y in value] if opt.render == "list" else dict(value)
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    lines.append("[tokenizers]")
    for pattern, src in cfg.tokenizers:
        lines.append(f"{_key(pattern)} = {_toml_value(src)}")
    lines.append("")
    for name, value in cfg.extra.items():
        if isinstance(value, Mapping):
            lines.append(f"[{_key(name)}]")
            for k, v in value.items():
                lines.append(f"{_key(k)} = {_toml_value(v)}")
            lines.append("")
        else:
            lines.insert(1, f"{_key(name)} = {_toml_value(value)}")
    return "\n".join(lines).rstrip("\n") + "\n"
