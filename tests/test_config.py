"""Flag parsing that builds the RunConfig: server lists and port ranges."""

from __future__ import annotations

import pytest

from gen_pipeline.cli import main
from gen_pipeline.config import parse_servers
from gen_pipeline.errors import ConfigError


@pytest.mark.parametrize(
    ("spec", "urls"),
    [
        ("127.0.0.1:30000-30002", ("http://127.0.0.1:30000", "http://127.0.0.1:30001", "http://127.0.0.1:30002")),
        ("http://h:30000-30001/v1/", ("http://h:30000/v1", "http://h:30001/v1")),
        ("30000,30002", ("http://127.0.0.1:30000", "http://127.0.0.1:30002")),
        ("https://h.example/api/", ("https://h.example/api",)),
        ("http://[::1]:8000", ("http://[::1]:8000",)),
        ("h:65535", ("http://h:65535",)),
    ],
)
def test_server_specs(spec, urls):
    """Each accepted form gives these base URLs."""
    assert parse_servers(spec) == urls


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("http://host:lo-hi", "bad server 'http://host:lo-hi'"),
        ("host:70000", "ports are 1-65535"),
        ("http://host:70000", "ports are 1-65535"),
        ("https://host:65536/v1", "ports are 1-65535"),
        ("host:40000-70000", "ports are 1-65535"),
        ("http://host:0", "ports are 1-65535"),
        ("http://host:2-1", "runs backwards"),
        ("http://host:", "use host:port"),
        ("http://:8000", "use host:port"),
        ("localhost", "use host:port"),
    ],
)
def test_bad_server_specs_are_config_errors(spec, says):
    """A range in a URL that is not one, or a port outside 1-65535, is refused before anything runs."""
    with pytest.raises(ConfigError, match=says):
        parse_servers(spec)


@pytest.mark.parametrize("spec", ["http://127.0.0.1:lo-hi", "127.0.0.1:70000", "http://127.0.0.1:99999"])
def test_bad_servers_give_one_line_not_a_traceback(spec, write_jsonl, tmp_path, capsys):
    """generate exits 1 with one `error:` line naming the server."""
    path = write_jsonl([{"prompt": "hi"}])
    code = main(["generate", "-i", str(path), "-o", str(tmp_path / "o"), "-s", spec, "--startup-timeout", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith("error: bad server")
