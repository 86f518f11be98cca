"""sniffer.runtime.config and the option layer of ``sparseety run`` (no capture is started)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from sniffer.cli import main
from sniffer.runtime.config import Config, ConfigError, load_config, parse_config, render_toml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "systemd" / "sparseety.toml.example"


def run_cli(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(main, ["run", *args])
    return res.exit_code, res.stdout, res.stderr


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "sparseety.toml"
    p.write_text(text)
    return str(p)


def test_defaults() -> None:
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.interface == "lo"
    assert cfg.ports == (8000,)
    assert cfg.backend == "packet"
    assert cfg.database == "sqlite:///./sparseety.db"
    assert cfg.queue_size == 1024
    assert cfg.flush_interval == 1.0
    assert cfg.batch_size == 5000
    assert cfg.capture_ports == (8000,)
    assert dict(cfg.extra) == {}


def test_sectioned_toml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
log_level = "debug"
retention_days = 30
[capture]
interface = "eth0"
ports = [8000, 8001]
queue_size = 16
idle_timeout = 60
[store]
database = "/tmp/x.db"
flush_interval = 0.25
batch_size = 100
[labels]
8000 = "baseline"
8001 = "sparse"
[metrics]
listen = "127.0.0.1:9465"
[redaction]
enabled = false
patterns = [{ name = "APIKEY", regex = "sk-[A-Za-z0-9]{20,}" }]
[sampling]
rate = 0.25
[tokenizers]
"deepseek-*" = "/models/ds"
[custom]
anything = 1
""",
    )
    cfg = load_config(path)
    assert cfg.interface == "eth0"
    assert cfg.ports == (8000, 8001)
    assert cfg.queue_size == 16
    assert cfg.idle_timeout == 60.0
    assert cfg.database == "/tmp/x.db"
    assert cfg.flush_interval == 0.25
    assert cfg.batch_size == 100
    assert dict(cfg.labels) == {8000: "baseline", 8001: "sparse"}
    assert cfg.log_level == "debug"
    assert cfg.metrics_listen == "127.0.0.1:9465"
    assert cfg.redact is False
    assert cfg.redact_patterns == (("APIKEY", "sk-[A-Za-z0-9]{20,}"),)
    assert cfg.sample_rate == 0.25
    assert cfg.tokenizers == (("deepseek-*", "/models/ds"),)
    assert cfg.extra == {"retention_days": 30, "custom": {"anything": 1}}
    assert cfg.source == path


def test_flat_toml_and_labelled_ports_are_captured() -> None:
    cfg = parse_config({"interface": "lo", "ports": [9000], "labels": {"9001": "b"}})
    assert cfg.ports == (9000,)
    assert cfg.capture_ports == (9000, 9001)


def test_example_file_parses() -> None:
    cfg = load_config(EXAMPLE)
    assert cfg.ports == (8000, 8001)
    assert dict(cfg.labels) == {8000: "baseline", 8001: "sparse"}
    assert cfg.database == "sqlite:////var/lib/sparseety/sparseety.db"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[capture]\nportz = [1]\n", "unknown key 'portz' in [capture]"),
        ("[store]\ninterface = 'lo'\n", "unknown key 'interface' in [store]"),
        ("[capture]\nports = [70000]\n", "port 70000 out of range"),
        ("[capture]\nbackend = 'pcap'\n", "backend"),
        ("[capture]\nqueue_size = 0\n", "queue_size"),
        ("[capture]\nqueue_size = 'many'\n", "expected an integer"),
        ("[store]\nflush_interval = -1\n", "flush_interval"),
        ("[capture]\npids = [12]\n", "need backend = 'ebpf'"),
        ("[labels]\nbaseline = 8000\n", "not a port number"),
        ("interface = 'lo'\n[capture]\ninterface = 'eth0'\n", "set twice"),
        ("log_level = 'loud'\n", "log_level"),
        ("[capture\n", "invalid TOML"),
        ("[capture]\nblock_size = 1000\n", "block_size"),
    ],
)
def test_bad_config_is_one_line_exit_2(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=None) as info:
        load_config(path)
    assert needle in str(info.value)
    code, out, err = run_cli("--config", path, "--print-config")
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sparseety: config error: ")
    assert needle in lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    code, _, err = run_cli("--config", str(tmp_path / "nope.toml"))
    assert code == 2
    assert "no such config file" in err


def test_print_config_defaults_round_trip() -> None:
    code, out, err = run_cli("--print-config")
    assert code == 0, err
    data = tomllib.loads(out)
    assert data["capture"]["interface"] == "lo"
    assert data["capture"]["ports"] == [8000]
    assert data["store"]["database"] == "sqlite:///./sparseety.db"
    assert parse_config(data) == Config()


def test_cli_flags_override_toml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[capture]\ninterface = 'eth9'\nports = [8000]\nqueue_size = 16\n"
        "[store]\nbatch_size = 7\n[labels]\n8000 = 'baseline'\n[metrics]\nlisten = '[::1]:1'\n",
    )
    code, out, err = run_cli(
        "--config",
        path,
        "--interface",
        "lo",
        "--port",
        "9000",
        "--port",
        "9001",
        "--label",
        "9001=sparse",
        "--db",
        "/tmp/over.db",
        "--queue-size",
        "4",
        "--flush-interval",
        "0.5",
        "--print-config",
    )
    assert code == 0, err
    cfg = parse_config(tomllib.loads(out))
    assert cfg.interface == "lo"
    assert cfg.ports == (9000, 9001)
    assert dict(cfg.labels) == {9001: "sparse"}  # a flag replaces the whole table
    assert cfg.database == "/tmp/over.db"
    assert cfg.queue_size == 4
    assert cfg.flush_interval == 0.5
    assert cfg.batch_size == 7  # not overridden: from the file
    assert cfg.metrics_listen == "[::1]:1"


def test_cli_bad_flag_values_exit_2() -> None:
    code, _, err = run_cli("--port", "0", "--print-config")
    assert code == 2
    assert err.strip() == "sparseety: config error: ports: port 0 out of range 1-65535"
    code, _, err = run_cli("--label", "baseline", "--print-config")
    assert code == 2
    assert "not PORT=NAME" in err
    code, _, err = run_cli("--pid", "12", "--print-config")
    assert code == 2
    assert "ebpf" in err
    code, _, err = run_cli("--backend", "ebpf", "--pid", "12", "--comm", "x" * 16)
    assert code == 2
    assert "comms" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--label", "baseline"), "--label 'baseline' is not PORT=NAME"),
        (("--label", "x8000=a"), "--label 'x8000=a' is not PORT=NAME"),
        (("--label", "8000="), "--label '8000=' is not PORT=NAME"),
        (("--tokenizer", "m="), "--tokenizer 'm=' is not PATTERN=SOURCE"),
        (("--redact-pattern", "=x"), "--redact-pattern '=x' is not NAME=REGEX"),
        (("--otlp-header", " =v"), "--otlp-header ' =v' is not NAME=VALUE"),
    ],
)
def test_cli_bad_pairs_name_the_flag_and_the_form(args: tuple[str, ...], message: str) -> None:
    code, out, err = run_cli(*args, "--print-config")
    assert (code, out) == (2, "")
    assert err == f"sparseety: config error: {message}\n"


def test_cli_pairs_split_at_the_first_equals_sign() -> None:
    code, out, err = run_cli(
        "--label",
        " 8000=a=b",
        "--redact-pattern",
        "KEY=k=[0-9]+",
        "--otlp-header",
        " x-team = a=b",
        "--print-config",
    )
    assert code == 0, err
    cfg = parse_config(tomllib.loads(out))
    assert dict(cfg.labels) == {8000: "a=b"}
    assert cfg.redact_patterns == (("KEY", "k=[0-9]+"),)
    assert cfg.otlp_headers == (("x-team", " a=b"),)


def test_sparseety_db_means_the_same_for_run_as_for_the_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--db`` first, then ``$SPARSEETY_DB``, then the config file's, then the
    default: as ``top --config`` reads it; the readers take the same variable."""
    path = write(tmp_path, "[store]\ndatabase = 'from-toml.db'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPARSEETY_DB", str(tmp_path / "from-env.db"))
    for args, expected in (
        ((), str(tmp_path / "from-env.db")),
        (("--config", path), str(tmp_path / "from-env.db")),
        (("--config", path, "--db", "from-flag.db"), "from-flag.db"),
    ):
        code, out, err = run_cli(*args, "--print-config")
        assert code == 0, err
        assert parse_config(tomllib.loads(out)).database == expected, args
    res = CliRunner().invoke(main, ["streams"])  # a reader: the same file, not there
    assert res.exit_code == 1
    assert f"no database at {str(tmp_path / 'from-env.db')!r}" in res.stderr
    monkeypatch.setenv("SPARSEETY_DB", "")  # empty: as if unset, for every command
    code, out, err = run_cli("--config", path, "--print-config")
    assert code == 0, err
    assert parse_config(tomllib.loads(out)).database == "from-toml.db"
    res = CliRunner().invoke(main, ["streams"])
    assert "no database at 'sparseety.db'" in res.stderr


def test_render_toml_round_trips_everything() -> None:
    cfg = Config(
        interface="eth0",
        ports=(1, 2),
        labels={2: 'we"ird'},
        backend="ebpf",
        pids=(5,),
        comms=("python3",),
        database="postgresql://u:p@h/db",
        flush_interval=2.5,
        batch_size=9,
        queue_size=3,
        ring_blocks=8,
        block_size=1 << 17,
        idle_timeout=10.0,
        log_level="warning",
        metrics_listen="127.0.0.1:9999",
        sample_rate=0.5,
        redact_patterns=(("X", "x+"),),
        tokenizers=(("m-*", "/t"),),
        retention_days=7.0,
        extra={"custom": {"k": "v"}, "top": 7},
    )
    assert parse_config(tomllib.loads(render_toml(cfg))) == cfg


def test_feature_tables_reject_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="unknown key 'prompts' in \\[redaction\\]"):
        parse_config({"redaction": {"prompts": True}})
    with pytest.raises(ConfigError, match="sampling rate"):
        parse_config({"sampling": {"rate": 2}})
    with pytest.raises(ConfigError, match="bad regex"):
        parse_config({"redaction": {"patterns": [{"name": "x", "regex": "("}]}})
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_config({"metrics": {"listen": "nowhere"}})


def test_with_overrides_ignores_none_and_validates() -> None:
    cfg = Config().with_overrides({"interface": None, "queue_size": 5})
    assert cfg.queue_size == 5 and cfg.interface == "lo"
    with pytest.raises(ConfigError, match="queue_size"):
        Config().with_overrides({"queue_size": -1})
    with pytest.raises(ConfigError, match="unknown option"):
        Config().with_overrides({"colour": "red"})


def test_node_key_flag_and_default(tmp_path: Path) -> None:
    import socket

    assert Config().node == socket.gethostname()
    assert parse_config({"node": "gpu-07"}).node == "gpu-07"
    with pytest.raises(ConfigError, match="node"):
        parse_config({"node": ""})
    with pytest.raises(ConfigError, match="node"):
        parse_config({"node": "a\nb"})
    cfg = tmp_path / "s.toml"
    cfg.write_text('node = "from-toml"\n')
    res = CliRunner().invoke(main, ["run", "--config", str(cfg), "--print-config"])
    assert res.exit_code == 0 and 'node = "from-toml"' in res.output
    res = CliRunner().invoke(
        main, ["run", "--config", str(cfg), "--node", "from-flag", "--print-config"]
    )
    assert res.exit_code == 0 and 'node = "from-flag"' in res.output
    assert parse_config(tomllib.loads(res.output)).node == "from-flag"


def test_every_option_is_declared_once_and_reaches_flags_toml_and_print_config() -> None:
    """The run command's flags, the TOML tables and ``--print-config`` all come
    from ``OPTIONS`` (the Config fields): nothing is listed twice, each flag
    sets its own option, and each option's key shows in the printed config."""
    from dataclasses import fields

    from sniffer.cli.run import run
    from sniffer.runtime.config import OPTIONS, TABLES

    names = [o.name for o in OPTIONS]
    assert names == [f.name for f in fields(Config) if f.name not in ("extra", "source")]
    flags = [o.flag.name for o in OPTIONS if o.flag is not None]
    assert len(set(flags)) == len(flags)
    params = {p.name for p in run.params}
    assert params == {o.dest for o in OPTIONS if o.flag is not None} | {
        "config_path",
        "print_config",
    }
    assert {p.opts[0] for p in run.params} == {*flags, "--config", "--print-config"}
    printed = tomllib.loads(render_toml(Config()))
    for o in OPTIONS:
        if o.table in ("labels", "tokenizers"):
            assert o.table in printed
        elif o.table in ("capture", "store"):
            assert o.key in printed[o.table], o.name
        elif o.table:
            assert TABLES[o.table][o.key] == o.name and o.key in printed[o.table], o.name
        else:
            assert o.key in printed, o.name
