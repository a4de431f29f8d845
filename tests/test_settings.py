"""`--config FILE`: generate's flags in a TOML file, overridden by the command line (or the API's keywords),
checked as the flags are, and recorded in the manifest without secrets."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from e2e import fleet_in_thread, prompts, read_jsonl

import gen_pipeline
from gen_pipeline.cli import main, parse_argv, subcommands
from gen_pipeline.cli.generate import config_from_args
from gen_pipeline.config import RunConfig
from gen_pipeline.engine.setup import settings_record
from gen_pipeline.errors import ConfigError
from gen_pipeline.settings import FILE_OPTIONS, read_settings
from gen_pipeline.sim import SimConfig, free_ports
from gen_pipeline.tokens import TINY_TOKENIZER

REPO = Path(__file__).resolve().parents[1]


def toml(tmp_path: Path, text: str, name: str = "run.toml") -> Path:
    """A config file holding `text`."""
    path = tmp_path / name
    path.write_text(text)
    return path


def test_keys_are_the_long_flags_with_dash_or_underscore(tmp_path):
    """max-tokens and max_tokens are the same key; values keep their TOML types."""
    path = toml(tmp_path, "max-tokens = 64\nsafety_margin = 4\nforce = true\nsampling = { top_k = 20 }\n")
    assert read_settings(path) == {"max_tokens": 64, "safety_margin": 4, "force": True, "sampling": {"top_k": 20}}


def test_every_visible_generate_flag_is_a_key():
    """The keys a file may set are exactly generate's flags (but --config itself): a new flag is a key too."""
    parser = subcommands()["generate"]
    flags = {a.dest for a in parser._actions if a.option_strings and a.help is not argparse.SUPPRESS}
    assert flags - {"help", "config"} == FILE_OPTIONS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max-token = 64", "unknown key 'max-token'; did you mean 'max-tokens'?"),
        ("tempreature = 0.5", "unknown key 'tempreature'; did you mean 'temperature'?"),
        ("share = 2", "unknown key 'share'"),  # set by --workers for its claimers, never by a user
        ("max-tokens = 64\nmax_tokens = 32", "'max_tokens' is given twice"),
        ('max-tokens = "64"', "max-tokens must be int, not '64'"),
        ("temperature = true", "temperature must be float, not True"),
        ("force = 1", "force must be bool, not 1"),
        ("limit = 2.5", "limit must be int, not 2.5"),  # TOML has no None ("int or None" before)
        ("sampling = 3", "sampling must be str or table, not 3"),
        ("servers = [1, 2]", "servers must be str or list, not [1, 2]"),  # "str or tuple or list" before
        ("validate = 5", "validate must be str or list, not 5"),  # "str or Sequence" before
        ("out = 5", "out must be str or path, not 5"),
        ("[generate]\nsamples = 2", r"unknown table [generate]: the flags are keys at the top of the file"),
        ("max-tokens = ", "not valid TOML"),
    ],
)
def test_a_bad_file_is_one_error_naming_the_key(tmp_path, text, message):
    """An unknown key names itself and the flag it is close to; a value of the wrong type says which type."""
    with pytest.raises(ConfigError, match="run.toml: " + message.replace("?", r"\?").replace("[", r"\[")):
        read_settings(toml(tmp_path, text))


def test_a_missing_file_is_one_error(tmp_path, capsys):
    """generate --config nope.toml: one 'error:' line, exit 1."""
    assert main(["generate", "--config", str(tmp_path / "nope.toml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --config") and "cannot read it" in err and len(err.splitlines()) == 1


def test_the_command_line_wins_over_the_file(tmp_path):
    """The file gives --input and --out (no longer required) and settings; flags given on the command line
    win; what neither gives keeps its default."""
    path = toml(
        tmp_path,
        'input = "in.jsonl"\nout = "runs/x"\nservers = ["h:1", "h:2"]\nmax-tokens = 64\nmin-tokens = 8\n'
        'temperature = 0.5\nretry-failed = ["timeout"]\nprogress = "log"\n',
    )
    config = config_from_args(parse_argv(["generate", "--config", str(path), "--max-tokens", "32", "-o", "other"]))
    assert config.input == Path("in.jsonl") and config.out == Path("other")
    assert config.max_tokens == 32 and config.min_tokens == 8 and config.progress == "log"
    assert config.servers == ("http://h:1", "http://h:2") and config.retry_failed == frozenset({"timeout"})
    assert config.sampling == {"temperature": 0.5} and config.safety_margin == 16


def test_a_file_value_is_checked_as_the_flag_is(tmp_path, capsys):
    """A value the flag would refuse is refused from the file too, in one line (exit 1)."""
    path = toml(tmp_path, 'input = "in.jsonl"\nout = "o"\nturns = "some"\n')
    assert main(["generate", "--config", str(path)]) == 1
    assert capsys.readouterr().err.strip() == "error: --turns: last or all"


def test_an_unknown_key_stops_generate_before_anything_is_made(tmp_path, capsys, monkeypatch):
    """generate --config with a misspelt key: one line naming it and the close flag; no run directory."""
    monkeypatch.chdir(tmp_path)
    path = toml(tmp_path, 'input = "in.jsonl"\nout = "o"\nmax-token = 5\n')
    assert main(["generate", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert err == f"error: --config {path}: unknown key 'max-token'; did you mean 'max-tokens'?\n"
    assert not (tmp_path / "o").exists()


def test_without_input_in_either_place_the_usage_error_stays(tmp_path, capsys):
    """A file that names no input leaves --input required (argparse's usage error, exit 2)."""
    path = toml(tmp_path, 'out = "o"\n')
    with pytest.raises(SystemExit) as stopped:
        main(["generate", "--config", str(path)])
    assert stopped.value.code == 2 and "--input" in capsys.readouterr().err


def test_settings_are_recorded_without_secrets():
    """The manifest's settings: the options as the run took them, with no API key, no server password and no
    password in an --on-stall URL."""
    config = RunConfig(
        input=Path("in.jsonl"),
        out=Path("o"),
        servers="http://user:pw-secret@h:1",  # type: ignore[arg-type]
        max_tokens=99,
        sampling={"temperature": 0.5},
        on_stall="curl https://bot:tok-secret@hooks.example/x",
        retry_failed=frozenset({"timeout", "server_error"}),
    )
    record = settings_record(config)
    assert record["max_tokens"] == 99 and record["servers"] == ["http://h:1"] and record["input"] == "in.jsonl"
    assert record["sampling"] == {"temperature": 0.5} and record["retry_failed"] == ["server_error", "timeout"]
    assert record["on_stall"] == "curl https://hooks.example/x" and record["max_attempts"] == 6
    assert set(record) <= FILE_OPTIONS and "api_key" not in record
    keyed = RunConfig(input=Path("i"), out=Path("o"), api_key="sk-secret")
    text = orjson.dumps([record, settings_record(keyed)]).decode()
    assert "secret" not in text


def test_api_reads_the_file_and_keywords_win(tmp_path):
    """gen_pipeline.read_config("run.toml", ...) builds the RunConfig the command line would; keywords win."""
    path = toml(tmp_path, 'input = "in.jsonl"\nout = "o"\nmax-tokens = 64\nseed = 3\n')
    config = gen_pipeline.read_config(path, max_tokens=32)
    assert config.max_tokens == 32 and config.sampling == {"seed": 3} and config.out == Path("o")
    assert config == config_from_args(parse_argv(["generate", "--config", str(path), "--max-tokens", "32"]))
    with pytest.raises(ConfigError, match="unknown key 'sed'; did you mean 'seed'"):
        gen_pipeline.read_config(toml(tmp_path, "sed = 3", "bad.toml"))
    with pytest.raises(ConfigError, match="out must be a path"):
        gen_pipeline.generate(config=toml(tmp_path, 'input = "in.jsonl"', "no-out.toml"))


def test_a_run_from_a_config_file_records_its_settings(tmp_path):
    """gen_pipeline.generate(config=...) runs what the file says (a keyword winning) and the manifest records
    the effective settings, without the file's API key."""
    inp, out = tmp_path / "in.jsonl", tmp_path / "out"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(6)))
    with fleet_in_thread(SimConfig(ports=tuple(free_ports(2)), health_delay=0.0)) as servers:
        path = toml(
            tmp_path,
            f'input = "{inp}"\nout = "{out}"\nservers = "{servers}"\ntokenizer = "{TINY_TOKENIZER}"\n'
            'max-tokens = 48\nlimit = 5\nprogress = "off"\napi-key = "sk-file-secret"\nmax-attempts = 2\n',
        )
        summary = gen_pipeline.generate(config=path, limit=4)
    assert summary["exit_code"] == 0 and summary["completed"] == 4
    assert {r["max_tokens"] for r in read_jsonl(out / "completions.jsonl")} <= {48}
    manifest = (out / "manifest.json").read_text()
    settings = json.loads(manifest)["settings"]
    assert settings["limit"] == 4 and settings["max_tokens"] == 48 and settings["max_attempts"] == 2
    assert settings["tokenizer"] == str(TINY_TOKENIZER) and "sk-file-secret" not in manifest


def test_check_takes_the_config_file(tmp_path, capsys):
    """check --config FILE plans with the file's settings (its --limit and --max-tokens here)."""
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in prompts(8)))
    with fleet_in_thread(SimConfig(ports=tuple(free_ports(1)), health_delay=0.0)) as servers:
        path = toml(
            tmp_path,
            f'input = "{inp}"\nservers = "{servers}"\ntokenizer = "{TINY_TOKENIZER}"\nlimit = 3\nmax-tokens = 40\n',
        )
        code = main(["check", "--config", str(path), "--json", str(tmp_path / "check.json")])
    report = json.loads((tmp_path / "check.json").read_text())
    assert code == 0, capsys.readouterr()
    assert report["plan"]["rows"] == 3


def test_the_nightly_job_passes_its_config_file(tmp_path):
    """run/nightly.sh --config FILE (or NIGHTLY_CONFIG) hands it to generate, before the flags it gives."""
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "gp"
    fake.write_text(
        f"#!{sys.executable}\nimport json, sys, pathlib\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "a = sys.argv[1:]\nout = pathlib.Path(a[a.index('--out') + 1])\n"
        "if a[0] == 'prepare':\n    out.write_text('{\"prompt\": \"hi\"}\\n')\n"
        "else:\n    (out / 'summary.json').write_text('{}')\n"
    )
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIGHTLY_", "GEN_PIPELINE"))}
    env |= {"GEN_PIPELINE": str(fake), "NIGHTLY_CONFIG": "env.toml"}
    argv = ["bash", str(REPO / "run" / "nightly.sh"), "--source", "s.jsonl", "--dataset-dir", str(tmp_path / "ds")]
    for extra, expected in (([], "env.toml"), (["--config", "flag.toml", "--date", "2026-01-02"], "flag.toml")):
        proc = subprocess.run([*argv, *extra], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        generate = [json.loads(line) for line in log.read_text().splitlines()][-1]
        assert generate[0] == "generate" and generate[generate.index("--config") + 1] == expected
