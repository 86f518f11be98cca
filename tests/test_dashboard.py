"""The Grafana dashboard and the Prometheus rules in ``dashboards/``, proven
against a real Prometheus scraping a live sidecar.

The live test (root) starts two fixture servers (labels ``baseline`` and
``candidate``), ``sparseety run`` on ``lo`` with a metrics listener and an
OTLP endpoint nobody listens on, and Debian's ``prometheus`` in a temporary
directory scraping the sidecar every second (the scrape adds the ``node``
label, as the README tells operators to) with the rules loaded. Real clients
stream through both servers all along: complete streams, client aborts, error
objects, split UTF-8 (token anomalies), a malformed request (a pipeline
error), and streams from servers that report speculative decoding (the
fixture server's ``draftK-acceptP`` mode: vLLM's ``metrics`` on the usage
chunk, llama.cpp's ``timings`` on the finish chunk; each label its own
acceptance rate). Then every query of every panel, with the template variables
substituted as Grafana would, goes through ``/api/v1/query`` and must return
finite samples whose labels are the ones the legend names and the values the
test produced; every vector selector in it must match series on its own (so
an ``or ... * 0`` cannot hide a wrong matcher); every template variable
must list the real values; every rule must evaluate with health ``ok``, every
recording rule must produce series, and the alerts must be in the state the
traffic calls for. The speculative-decoding panels and rules must also give
each label's figures as its clients read them from the servers' reports
(between the lowest and highest per-stream acceptance rate and length). A
broken copy of a panel (wrong metric name, wrong label) is checked too and
must be rejected. The fast tests check the JSON is what
``dashboards/make_dashboard.py`` writes and run ``promtool`` on the rules.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from sniffer.capture.afpacket import have_capture_privilege
from sniffer.llm.values import ACCEPT_LENGTH_BUCKETS
from tests.fixture_server import free_port
from tests.test_live_e2e import daemon, httpx_stream, procs, server  # noqa: F401 (procs: fixture)

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
DASHBOARD = DASHBOARDS / "sparseety.json"
RULES = DASHBOARDS / "sparseety.rules.yml"
RULE_TESTS = DASHBOARDS / "sparseety.rules.test.yml"
NODE = "dash-node-1"
LABELS = ("baseline", "candidate")
#: what Grafana would put for its built-in interval variables at a 1 s scrape
BUILTINS = {"__rate_interval": "20s", "__interval": "5s", "__range": "5m"}
DEADLINE = 45.0  # seconds of traffic at most before the queries must all answer

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Debian's prometheus package is not installed (scripts/install-deps.sh)",
)


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        if p["type"] == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


# ------------------------------------------------------------------ fast


def test_dashboard_is_what_the_script_writes() -> None:
    sys.path.insert(0, str(DASHBOARDS))
    try:
        import make_dashboard
    finally:
        sys.path.remove(str(DASHBOARDS))
    assert DASHBOARD.read_text(encoding="utf-8") == make_dashboard.render(), (
        "dashboards/sparseety.json is stale: run python dashboards/make_dashboard.py"
    )


def test_dashboard_is_provisioning_ready() -> None:
    dash = load_dashboard()
    assert dash["uid"] and dash["title"] and "id" not in dash
    names = {v["name"]: v for v in dash["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource"
    assert names["datasource"]["query"] == "prometheus"
    for name in ("node", "label", "baseline", "candidate"):
        assert names[name]["type"] == "query"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in panels(dash):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            if "$__rate_interval" not in t["expr"]:
                assert "rate(" not in t["expr"] and "increase(" not in t["expr"], t["expr"]
            # every panel follows the node filter
            assert "$node" in t["expr"], (p["title"], t["expr"])


@needs_prometheus
def test_promtool_checks_the_rules_and_their_unit_tests() -> None:
    check = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout
    unit = subprocess.run(
        ["promtool", "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=DASHBOARDS,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


# --------------------------------------------------------- live Prometheus


class Prom:
    """A Prometheus server in a temporary directory (stopped by PID)."""

    def __init__(self, tmp: Path, metrics_port: int, rules: Path) -> None:
        self.port = free_port(lo=19500, hi=19999)
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            f"rule_files: ['{rules}']\n"
            "scrape_configs:\n"
            "  - job_name: sparseety\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{metrics_port}']\n"
            f"        labels: {{node: {NODE}}}\n",
            encoding="utf-8",
        )
        self.log_path = tmp / "prometheus.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=log,
                cwd=tmp,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"prometheus did not become ready:\n{self.log_path.read_text()}")

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise PromError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class PromError(Exception):
    pass


_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^{}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def substitute(text: str, values: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"unknown template variable ${name} in {text!r}"
        return values[name]

    return _VAR.sub(one, text)


def variable_values(baseline: str, candidate: str) -> dict[str, str]:
    return {
        **BUILTINS,
        "node": NODE,
        "label": "|".join(LABELS),  # Grafana's regex of a multi-value selection
        "baseline": baseline,
        "candidate": candidate,
    }


def check_target(prom: Prom, expr: str, legend: str, values: dict[str, str]) -> list[str]:
    """What is wrong with one panel query (nothing: an empty list)."""
    problems: list[str] = []
    q = substitute(expr, values)
    try:
        result = prom.query(q)
    except PromError as exc:
        return [str(exc)]
    if not result:
        return [f"no data: {q}"]
    # every vector selector must match series by itself: an 'or ... * 0' or a
    # ratio must not hide a selector that matches nothing
    # (a negative matcher on a label the metric does not have matches every
    # series, so each label named must exist on the metric, and each literal
    # value compared with = or != must be one of its values)
    for name, matchers in _SELECTOR.findall(q):
        if not prom.query(f"count({name}{{{matchers}}})"):
            problems.append(f"selector {name}{{{matchers}}} matches no series")
        for label, op, value in _MATCHER.findall(matchers):
            if not prom.query(f'count({name}{{{label}!=""}})'):
                problems.append(f"{name} has no label {label!r}")
            elif op in ("=", "!=") and not prom.query(f'count({name}{{{label}="{value}"}})'):
                problems.append(f"{name} has no series with {label}={value!r}")
    wanted = _LEGEND.findall(legend)
    if '"$baseline"' in expr:
        allowed_labels = {values["baseline"]}
    elif '"$candidate"' in expr:
        allowed_labels = {values["candidate"]}
    else:
        allowed_labels = set(LABELS)
    seen_labels = set()
    for sample in result:
        metric = sample["metric"]
        value = float(sample["value"][1])
        if not math.isfinite(value):
            problems.append(f"{value} for {metric}: {q}")
        for name in wanted:
            if not metric.get(name):
                problems.append(f"legend names {{{{{name}}}}}, series {metric} has none: {q}")
        if "node" in metric and metric["node"] != NODE:
            problems.append(f"node {metric['node']!r}: {q}")
        if "label" in metric:
            seen_labels.add(metric["label"])
    if "label" in wanted and seen_labels != allowed_labels:
        problems.append(f"labels {sorted(seen_labels)}, expected {sorted(allowed_labels)}: {q}")
    return problems


def check_dashboard(prom: Prom, dash: dict[str, Any], values: dict[str, str]) -> list[str]:
    problems = []
    for p in panels(dash):
        for t in p["targets"]:
            for problem in check_target(prom, t["expr"], t.get("legendFormat", ""), values):
                problems.append(f"{p['title']!r} {t['refId']}: {problem}")
    return problems


def panel_expr(dash: dict[str, Any], title: str, ref: str, values: dict[str, str]) -> str:
    """One query of the dashboard, its variables substituted."""
    for p in panels(dash):
        if p["title"] == title:
            for t in p["targets"]:
                if t["refId"] == ref:
                    return substitute(t["expr"], values)
    raise AssertionError(f"no panel {title!r} with a query {ref}")


#: how far a ratio of two rate()s may stray from the ratio of the counts
#: (rate() extrapolates each series to the window's ends on its own)
RATE_SLACK = 0.02


def check_spec(
    prom: Prom, dash: dict[str, Any], values: dict[str, str], seen: SpecSeen
) -> list[str]:
    """The speculative-decoding panels and recording rules against what the
    clients saw the servers report: a value between the lowest and highest
    per-stream figure of its label (any mix of those streams gives one), a
    series per label and source; and the cadence classes of the outputs of
    the servers that speculate and of those that do not."""
    problems: list[str] = []
    sources = {"vllm", "llama.cpp"}
    for label in LABELS:
        if seen.sources.get(label) != sources:
            problems.append(f"{label}: the clients saw reports from {seen.sources.get(label)}")
    want = {(label, source) for label in LABELS for source in sources}
    for ref in "AB":
        expr = panel_expr(dash, "Draft and accepted tokens per second", ref, values)
        got = {(m["metric"].get("label"), m["metric"].get("source")) for m in prom.query(expr)}
        if got != want:
            problems.append(f"draft/accepted {ref}: series {sorted(got)}, expected {sorted(want)}")

    def within(what: str, expr: str, ranges: dict[str, tuple[float, float]], slack: float) -> None:
        result = prom.query(expr)
        got_labels = {m["metric"].get("label") for m in result}
        if got_labels != set(LABELS):
            problems.append(f"{what}: labels {sorted(got_labels, key=str)}: {expr}")
        for m in result:
            label, value = m["metric"].get("label"), float(m["value"][1])
            lo, hi = ranges.get(label, (math.nan, math.nan))
            if not lo - slack <= value <= hi + slack:
                problems.append(f"{what} of {label}: {value}, streams reported {lo}..{hi}")

    rate = panel_expr(dash, "Draft acceptance rate", "A", values)
    within("acceptance rate", rate, seen.rates, RATE_SLACK)
    within(
        "recorded acceptance rate",
        f'label_node:sparseety_server_spec_acceptance:ratio5m{{node="{NODE}"}}',
        seen.rates,
        RATE_SLACK,
    )
    length = panel_expr(dash, "Mean acceptance length", "A", values)
    within("mean acceptance length", length, seen.lengths, 4 * RATE_SLACK)
    within(
        "recorded mean acceptance length",
        "label:sparseety_server_spec_accept_length:mean5m",
        seen.lengths,
        4 * RATE_SLACK,
    )
    # the p50 from the histogram: within the buckets holding the label's lengths
    buckets = (0.0, *ACCEPT_LENGTH_BUCKETS)
    bucketed = {
        label: (max(b for b in buckets if b < lo), min(b for b in buckets if b >= hi))
        for label, (lo, hi) in seen.lengths.items()
    }
    p50 = panel_expr(dash, "Mean acceptance length", "B", values)
    within("acceptance length p50", p50, bucketed, 1e-9)

    # The cadence: the speculating llama.cpp servers (one token per event,
    # written back to back within a verification step) give bursty outputs,
    # most of them; the ones streaming a token every 2 ms steady ones.
    expr = panel_expr(dash, "Outputs per second by cadence", "A", values)
    got_c = {(m["metric"].get("label"), m["metric"].get("cadence")) for m in prom.query(expr)}
    for label in LABELS:
        if (label, "bursty") not in got_c or (label, "steady") not in got_c:
            problems.append(f"cadence series {sorted(got_c)}: no bursty or steady {label}")
    # (of the classified ones: the aborted streams are too short to tell)
    for model, most, other in (
        ("fake-llamacpp-draft4-.*", "bursty", "steady"),
        ("fake-delay[24]", "steady", "bursty"),
    ):
        counts: dict[str, dict[str, float]] = {label: {} for label in LABELS}
        matchers = f'node="{NODE}", model=~"{model}"'
        for m in prom.query(
            f"sum by (label, cadence) (sparseety_output_cadence_total{{{matchers}}})"
        ):
            counts[m["metric"]["label"]][m["metric"]["cadence"]] = float(m["value"][1])
        for label, by_class in counts.items():
            if by_class.get(most, 0.0) <= by_class.get(other, 0.0):
                problems.append(f"{model} outputs of {label} by cadence: {by_class}")
    share = prom.query(panel_expr(dash, "Bursty share of the outputs", "A", values))
    if {m["metric"].get("label") for m in share} != set(LABELS) or not all(
        0 < float(m["value"][1]) <= 1 for m in share
    ):
        problems.append(f"bursty share: {share}")
    return problems


def check_variables(prom: Prom, dash: dict[str, Any], values: dict[str, str]) -> list[str]:
    problems = []
    expected = {"node": {NODE}, "label": set(LABELS), "baseline": set(LABELS)}
    expected["candidate"] = expected["baseline"]
    for v in dash["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
        assert m, v["query"]
        selector, label = substitute(m.group(1), values), m.group(2)
        got = set(prom.api(f"label/{label}/values", **{"match[]": selector}))
        if got != expected[v["name"]]:
            problems.append(f"variable {v['name']}: {sorted(got)} from {v['query']['query']}")
    return problems


def bad_request(port: int) -> None:
    """A request whose Content-Length is not a number: the sidecar records an
    http error (and the server answers 400)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: twelve\r\n\r\n{}"
        )
        with contextlib.suppress(OSError):
            s.recv(4096)


#: the share of drafted tokens each label's server accepts (speculative
#: decoding; the fixture server's ``acceptP``), 4 drafted per step
ACCEPT_PCT = {"baseline": 75, "candidate": 40}


@dataclass
class SpecSeen:
    """What the clients saw the servers report about speculative decoding,
    per label: per-stream acceptance rates and (vLLM) acceptance lengths,
    each as its lowest and highest; streams per source."""

    rates: dict[str, tuple[float, float]] = field(default_factory=dict)
    lengths: dict[str, tuple[float, float]] = field(default_factory=dict)
    sources: dict[str, set[str]] = field(default_factory=dict)

    def add(self, label: str, source: str, draft: int, accepted: int, length: float | None) -> None:
        def widen(d: dict[str, tuple[float, float]], v: float) -> None:
            lo, hi = d.get(label, (v, v))
            d[label] = (min(lo, v), max(hi, v))

        widen(self.rates, accepted / draft)
        if length is not None:
            widen(self.lengths, length)
        self.sources.setdefault(label, set()).add(source)


def spec_stream(port: int, prompt: str, model: str, *, include_usage: bool) -> dict[str, Any]:
    """A streamed chat completion from a speculating server: the server's own
    report of it as the client read it from the last chunks (llama.cpp
    ``timings`` or vLLM ``metrics.speculative_decoding``), as
    ``{"source", "draft", "accepted", "length"}``."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": 24,
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    report: dict[str, Any] = {}
    with (
        httpx.Client(timeout=30) as c,
        c.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r,
    ):
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            if "timings" in obj:
                t = obj["timings"]
                report = {"source": "llama.cpp", "draft": t["draft_n"]}
                report |= {"accepted": t["draft_n_accepted"], "length": None}
            elif "metrics" in obj:
                sd = obj["metrics"]["speculative_decoding"]
                report = {"source": "vllm", "draft": sd["num_draft_tokens"]}
                report |= {"accepted": sd["num_accepted_draft_tokens"]}
                report["length"] = sd["mean_acceptance_length"]
    assert report, f"{model}: no speculative-decoding report in the stream"
    return report


def stream_with_usage(port: int, prompt: str, model: str, **kw: Any) -> None:
    """A streamed chat completion asking for usage (the server-usage panel)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": 24,
        "stream_options": {"include_usage": True},
    }
    with (
        httpx.Client(timeout=30) as c,
        c.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r,
    ):
        for _ in r.iter_lines():
            pass


class Traffic(threading.Thread):
    """Real clients against both servers until stopped (at most ``DEADLINE``
    seconds, at most 2,000 requests): complete streams with usage, client
    aborts, error objects, split UTF-8, a malformed request now and then."""

    def __init__(self, ports: dict[str, int]) -> None:
        super().__init__(daemon=True)
        self.ports = ports
        self.stop_event = threading.Event()
        self.requests = 0
        self.errors: list[str] = []
        self.spec = SpecSeen()
        self.spec_lock = threading.Lock()

    def spec_seen(self) -> SpecSeen:
        with self.spec_lock:
            return SpecSeen(dict(self.spec.rates), dict(self.spec.lengths), dict(self.spec.sources))

    def speculate(self, label: str, port: int, i: int) -> None:
        """One stream of each speculating server kind: vLLM's report on the
        usage chunk, llama.cpp's on the finish chunk (no include_usage)."""
        spec = f"draft4-accept{ACCEPT_PCT[label]}-delay2"
        for model, include_usage in ((f"fake-{spec}", True), (f"fake-llamacpp-{spec}", False)):
            got = spec_stream(port, f"{label} spec {i}", model, include_usage=include_usage)
            with self.spec_lock:
                self.spec.add(label, got["source"], got["draft"], got["accepted"], got["length"])

    def run(self) -> None:
        started = time.monotonic()
        i = 0
        while (
            not self.stop_event.is_set()
            and time.monotonic() - started < DEADLINE + 15
            and self.requests < 2000
        ):
            for label, port in self.ports.items():
                model = "fake-delay2" if label == "baseline" else "fake-delay4"
                try:
                    stream_with_usage(port, f"{label} prompt {i}", model)
                    httpx_stream(port, f"{label} abort {i}", model=model, abort_after=2)
                    httpx_stream(port, f"{label} fails {i}", model="fake-fail3", max_tokens=12)
                    httpx_stream(port, f"{label} cjk {i}", model="fake-cjk-fffd", max_tokens=16)
                    self.speculate(label, port, i)
                    if i % 5 == 0:
                        bad_request(port)
                except Exception as exc:  # recorded; the test fails on it
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                self.requests += 7
            i += 1
            self.stop_event.wait(0.1)


@pytest.fixture
def live(tmp_path: Path, procs: list[Any]) -> Iterator[tuple[Prom, Traffic]]:  # noqa: F811
    ports = {label: server(procs) for label in LABELS}
    mport = free_port(lo=19000, hi=19499)
    # an OTLP collector nobody runs: not in Prom's range (19500-19999), where
    # nothing binds it before Prom's own free_port could hand it out again
    dead = free_port(lo=21000, hi=21999)
    config = tmp_path / "sparseety.toml"
    config.write_text(
        f'[otlp]\nendpoint = "http://127.0.0.1:{dead}"\ntimeout = 1.0\nmetrics_interval = 1.0\n',
        encoding="utf-8",
    )
    args = ["--config", str(config), "--node", NODE, "--metrics-listen", f"127.0.0.1:{mport}"]
    args += ["--port", str(ports["baseline"])]
    for label, port in ports.items():
        args += ["--label", f"{port}={label}"]
    d = daemon(procs, tmp_path, *args)
    prom = Prom(tmp_path, mport, RULES)
    traffic = Traffic(ports)
    traffic.start()
    try:
        yield prom, traffic
    finally:
        traffic.stop_event.set()
        traffic.join(60)
        prom.stop()
        d.stop()


def wait_for(check: Any, deadline: float) -> list[str]:
    """Run ``check`` (a list of problems) until it has none or time runs out;
    the last problems."""
    problems = check()
    while problems and time.monotonic() < deadline:
        time.sleep(1.0)
        problems = check()
    return problems


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(
    not have_capture_privilege(), reason="live capture needs root or CAP_NET_RAW (packet sockets)"
)
@needs_prometheus
def test_every_panel_and_rule_answers_from_a_live_sidecar(live: tuple[Prom, Traffic]) -> None:
    prom, traffic = live
    dash = load_dashboard()
    values = variable_values("baseline", "candidate")
    deadline = time.monotonic() + DEADLINE
    problems = wait_for(lambda: check_dashboard(prom, dash, values), deadline)
    assert not traffic.errors, traffic.errors[:5]
    assert not problems, "\n".join(problems)
    assert not check_variables(prom, dash, values)

    # The speculative-decoding figures are the ones the servers reported.
    problems = wait_for(
        lambda: check_spec(prom, dash, values, traffic.spec_seen()), time.monotonic() + 10
    )
    assert not problems, "\n".join(problems)

    # A panel whose metric name or label is wrong is rejected by the same check.
    good = (
        'sum by (label, node) (rate(sparseety_streams_total{label=~"$label", node=~"$node"}[20s]))'
    )
    assert not check_target(prom, good, "{{label}} · {{node}}", values)
    broken = [
        (good.replace("sparseety_streams_total", "sparseety_stream_total"), "{{label}}"),
        (good.replace("by (label, node)", "by (lable, node)"), "{{label}} · {{node}}"),
        (good.replace('label=~"$label"', 'model=~"$label"'), "{{label}}"),
        (good.replace('node=~"$node"', 'node=~"$node", state!="completed"'), "{{label}}"),
        (
            '(sum by (label) (rate(sparseety_streams_total{node=~"$node", status!="complete"}'
            '[20s])) or sum by (label) (rate(sparseety_streams_total{node=~"$node"}[20s])) * 0)'
            ' / sum by (label) (rate(sparseety_streams_total{node=~"$node"}[20s]))',
            "{{label}}",
        ),
    ]
    for expr, legend in broken:
        assert check_target(prom, expr, legend, values), expr

    # The rules: every one evaluates; recording rules give series with their
    # level's labels; the alerts are in the state this traffic calls for.
    def rules_ok() -> list[str]:
        out = []
        for group in prom.api("rules")["groups"]:
            for rule in group["rules"]:
                name = rule.get("name")
                if rule.get("health") != "ok" or rule.get("lastError"):
                    out.append(f"{name}: health {rule.get('health')} {rule.get('lastError')}")
                if rule["type"] != "recording":
                    continue
                result = prom.query(name)
                if not result:
                    out.append(f"recording rule {name}: no series")
                level = name.split(":")[0].split("_")
                for sample in result:
                    for label in level:
                        if not sample["metric"].get(label):
                            out.append(f"{name}: {sample['metric']} has no {label}")
                    if "label" in level and sample["metric"]["label"] not in LABELS:
                        out.append(f"{name}: {sample['metric']}")
        return out

    problems = wait_for(rules_ok, time.monotonic() + 10)
    assert not problems, "\n".join(problems)

    def alert_states() -> dict[str, dict[str, str]]:
        states = {}
        for group in prom.api("rules")["groups"]:
            for rule in group["rules"]:
                if rule["type"] == "alerting":
                    states[rule["name"]] = {
                        a["labels"].get("label") or a["labels"].get("node"): a["state"]
                        for a in rule.get("alerts", [])
                    }
        return states

    states = alert_states()
    # a quarter or more of each label's streams are aborted or fail: pending (for: 10m)
    assert set(states["SparseetyIncompleteStreams"]) == set(LABELS), states
    assert set(states["SparseetyIncompleteStreams"].values()) <= {"pending", "firing"}
    # flushes every 0.2 s, no hour of history (to measure a TTFT or acceptance
    # regression against), no OTLP queue overflow: quiet
    quiet = ("SparseetyFlushStalled", "SparseetyTTFTRegression", "SparseetyOtlpDrops")
    for name in (*quiet, "SparseetySpecAcceptanceDrop"):
        assert states[name] == {}, (name, states[name])

    # the drops alert agrees with the sidecar's own counters: pending when they
    # grew while Prometheus scraped (a loaded machine can starve the capture
    # thread), else quiet. Drops counted before the first scrape are in the
    # counter's first sample, which no increase() sees.
    def drops_agree() -> list[str]:
        grew = prom.query(
            f'sum(increase(sparseety_kernel_drops_total{{node="{NODE}"}}[5m]))'
            f' + sum(increase(sparseety_queue_drops_total{{node="{NODE}"}}[5m]))'
        )
        any_drop = bool(grew) and float(grew[0]["value"][1]) > 0
        got = alert_states()["SparseetyCaptureDrops"]
        want = {NODE: "pending"} if any_drop else {}
        return [] if got == want else [f"drops grew {grew}: alert {got}, expected {want}"]

    problems = wait_for(drops_agree, time.monotonic() + 10)
    assert not problems, problems
