"""The README's recipes run as written, and every `gen-pipeline` command line it shows parses.

Each bash block of the "Recipes" section runs in a scratch directory laid out like the repository root
(the Makefile, pyproject.toml and .venv linked in; the input files a recipe names written there), with
the simulated fleet standing in for the real one: `make generate` takes SERVERS from the environment as
it does from its command line, and `make` is told the venv is already installed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gen_pipeline.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def section(title: str) -> str:
    """The README's text under `## title`, up to the next `## ` heading."""
    return README.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def command_lines(text: str) -> list[str]:
    """Every command in the text's bash blocks (continuation lines joined, comments dropped) and inline
    code spans that start with `gen-pipeline ` and are complete (no `...` or [optional] parts)."""
    lines = []
    for block in bash_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(words)
    spans = [shlex.split(s) for s in re.findall(r"`(gen-pipeline [^`]+)`", text) if "..." not in s and "[" not in s]
    spans = [words for words in spans if len(words) > 2]  # `gen-pipeline check` alone names a command
    return [" ".join(map(shlex.quote, w)) for w in lines + spans]


def gen_pipeline_argv(command: str) -> list[str] | None:
    """The arguments after `gen-pipeline` in a command line (behind srun, ssh HOST, ...), or None."""
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word.endswith("gen-pipeline") and i + 1 < len(words) and not words[i + 1].startswith("-"):
            return [w for w in words[i + 1 :] if w not in ("&", ";")]
    return None


def test_every_gen_pipeline_command_in_the_readme_parses():
    """`gen-pipeline SUBCOMMAND ...` lines of the README (code blocks and complete inline commands) are
    accepted by the real command-line parser (the best-of-n export line once lacked its --out)."""
    commands = [argv for line in command_lines(README.read_text()) if (argv := gen_pipeline_argv(line))]
    assert len(commands) >= 10, commands
    parser = build_parser()
    for argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code == 0:  # --help
                continue
            pytest.fail(f"the README's `gen-pipeline {' '.join(argv)}` does not parse")


def test_the_slurm_recipe_asks_for_gpus_and_says_where_model_venv_and_tokenizer_come_from():
    """Every submit.sh line of the README requests GPUs, and the text around it names run/fleet.env (the
    model), how the tasks find the venv, and how compute nodes reach the tokenizer."""
    text = README.read_text()
    submits = [line for line in command_lines(text) if "run/slurm/submit.sh" in line]
    assert submits and all(re.search(r"--(gres|gpus)", line) for line in submits), submits
    for needed in ("run/fleet.env", ".venv/bin/activate", "HF_HOME", "--tokenizer DIR"):
        assert needed in text, needed


# The input files the recipes name, as a user would have them.
QUESTIONS = ["What is a prime number?", "Name three rivers.", "Why is the sky blue?"]
INPUTS = {
    "prompts/my.jsonl": b"".join(orjson.dumps({"id": i, "prompt": q}) + b"\n" for i, q in enumerate(QUESTIONS)),
    "sharegpt.json": orjson.dumps(
        [
            {
                "id": f"c{i}",
                "conversations": [
                    {"from": "human", "value": q},
                    {"from": "gpt", "value": "old answer"},
                    {"from": "human", "value": "And why?"},
                    {"from": "gpt", "value": "old answer"},
                ],
            }
            for i, q in enumerate(QUESTIONS)
        ]
    ),
}


def scratch_root(tmp_path: Path) -> Path:
    """A directory that looks like the repository root to the recipes, with their input files."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        (root / name).symlink_to(REPO / name)
    # The test's own venv, seen through a folder of the scratch root whose .installed is newer than
    # pyproject.toml: `make generate` then never reinstalls (an install from here, with no package folder
    # beside pyproject.toml, would rewrite the shared venv's editable install to an empty one).
    venv = root / ".venv"
    venv.mkdir()
    (venv / "bin").symlink_to(Path(sys.prefix) / "bin")
    (venv / ".installed").touch()
    for name, data in INPUTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


@pytest.mark.slow
def test_the_recipes_run_as_written(tmp_path):
    """Every bash block of the Recipes section exits 0 against a simulated fleet, and each run directory
    and dataset it names is there afterwards."""
    from procs import sim_fleet

    blocks = bash_blocks(section("Recipes"))
    assert len(blocks) >= 4, blocks
    root = scratch_root(tmp_path)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    with sim_fleet(2) as servers:
        for block in blocks:
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block],
                cwd=root,
                env={**env, "SERVERS": servers},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
    for out in re.findall(r"(?:OUT=|--out )((?:runs|datasets)/[\w-]+)", "\n".join(blocks)):
        assert (root / out).is_dir(), out
