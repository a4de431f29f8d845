"""The README's commands run as written, the docs' recipes too, and every `gen-pipeline` command line of the
README and the docs parses.

Each bash block runs in a scratch directory laid out like the repository root (the Makefile, pyproject.toml,
run/ and .venv linked in; the input files a command names written there), with the simulated fleet standing in
for the real one: `make generate` and `run/nightly.sh` take the servers from the environment as they do from
their command line, and `make` is told the venv is already installed. Paths that stand for the reader's own
(PLACEHOLDERS: a model folder, a data directory) are pointed at scratch copies. Three commands cannot run
inside a test as they are: `make demo` and `make test` are checked with `make -n`; `run/tmux_generate.sh`
runs with --dry-run, and the `make generate` it would type into tmux then runs; `gen-pipeline simulate` (the
test's fleet stands in for it) is only parsed.
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

from gen_pipeline.cli import parse_argv
from gen_pipeline.tokens import TINY_TOKENIZER

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
# The docs pages whose recipes run here (the README's "Recipes" section before the docs site).
RECIPE_PAGES = ("how-to/sampling.md", "how-to/draft-model-data.md")


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


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def config_files(text: str) -> dict[str, str]:
    """The TOML blocks of a page that name their file in a first-line comment (`# runs/my-run.toml`)."""
    blocks = re.findall(r"```toml\n# (\S+)\n(.*?)```", text, re.S)
    return {name: body for name, body in blocks}


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_gen_pipeline_command_parses(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`gen-pipeline SUBCOMMAND ...` lines of the README and the docs (code blocks and complete inline
    commands) are accepted by the command line as it parses them (the best-of-n export line once lacked its
    --out), over the page's own config files where a line names one with --config."""
    text = page.read_text()
    monkeypatch.chdir(tmp_path)
    for name, body in config_files(text).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    commands = [argv for line in command_lines(text) if (argv := gen_pipeline_argv(line))]
    for argv in commands:
        try:
            parse_argv(argv)
        except SystemExit as exc:
            if exc.code == 0:  # --help
                continue
            pytest.fail(f"{page.name}'s `gen-pipeline {' '.join(argv)}` does not parse")


def test_the_readme_and_docs_show_commands_of_every_kind():
    """The pages the parse test reads hold the commands users copy (it cannot pass on empty pages)."""
    commands = [
        argv for page in pages() for line in command_lines(page.read_text()) if (argv := gen_pipeline_argv(line))
    ]
    assert {argv[0] for argv in commands} >= {"generate", "check", "prepare", "export", "status", "report", "simulate"}


def test_the_slurm_recipe_asks_for_gpus_and_says_where_model_venv_and_tokenizer_come_from():
    """Every submit.sh line of the Slurm guide requests GPUs, and the text around it names run/fleet.env (the
    model), how the tasks find the venv, and how compute nodes reach the tokenizer."""
    text = (DOCS / "how-to" / "slurm.md").read_text()
    submits = [line for line in command_lines(text) if "run/slurm/submit.sh" in line]
    assert submits and all(re.search(r"--(gres|gpus)", line) for line in submits), submits
    for needed in ("run/fleet.env", ".venv/bin/activate", "HF_HOME", "--tokenizer DIR"):
        assert needed in text, needed


def test_the_readme_is_short():
    """The README stays a front door (issue 51: at most 150 lines); the rest lives in docs/."""
    assert len(README.read_text().splitlines()) <= 150


# The input files the commands name, as a user would have them.
QUESTIONS = ["What is a prime number?", "Name three rivers.", "Why is the sky blue?"]
CONVERSATIONS = [
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
INPUTS = {
    "prompts/my.jsonl": b"".join(orjson.dumps({"id": i, "prompt": q}) + b"\n" for i, q in enumerate(QUESTIONS)),
    "sharegpt.json": orjson.dumps(CONVERSATIONS),
}
# Paths in the README that stand for the reader's own -> where the scratch root has them.
PLACEHOLDERS = {
    "/models/Qwen3-8B": str(TINY_TOKENIZER),
    "/data/incoming/prompts.parquet": "incoming/prompts.parquet",
    "/data/gen/nightly": "datasets/nightly",
}


def scratch_root(tmp_path: Path) -> Path:
    """A directory that looks like the repository root to the commands, with their input files."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("Makefile", "pyproject.toml", "run"):
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
    for name in ("sample.jsonl", "answer.schema.json"):
        (root / "prompts" / name).symlink_to(REPO / "prompts" / name)
    (root / "incoming").mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": [f"Tonight: {q}" for q in QUESTIONS]}), root / "incoming" / "prompts.parquet")
    (root / "data").mkdir()
    ids = [f"p{i}" for i in range(len(QUESTIONS))]
    pq.write_table(pa.table({"id": ids, "prompt": QUESTIONS}), root / "data" / "prompts.parquet")
    return root


def runnable(block: str, root: Path) -> list[str]:
    """The block's commands as the test runs them (see the module docstring)."""
    for placeholder, path in PLACEHOLDERS.items():
        block = block.replace(placeholder, path)
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        if words[:2] == ["gen-pipeline", "simulate"]:
            continue
        if words[0] == "make" and words[1] in ("demo", "test"):
            commands.append(f"make -n {words[1]} | grep -q .")
        elif words[0] == "run/tmux_generate.sh":
            dry = subprocess.run(
                ["bash", *words[:1], "--dry-run", *words[1:]], cwd=root, capture_output=True, text=True
            )
            assert dry.returncode == 0, dry.stderr
            typed = next(shlex.split(w)[4] for w in dry.stdout.splitlines() if " send-keys " in w)
            commands.append(typed)
        else:
            commands.append(shlex.join(words))
    return commands


def run_blocks(blocks: list[str], root: Path, servers: str) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "TRANSFORMERS_VERBOSITY": "error",
        "SERVERS": servers,
        "NIGHTLY_SERVERS": servers,
    }
    for block in blocks:
        for command in runnable(block, root):
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"


def made_dirs(blocks: list[str]) -> list[str]:
    text = "\n".join(blocks)
    for placeholder, path in PLACEHOLDERS.items():
        text = text.replace(placeholder, path)
    return re.findall(r"(?:OUT=|--out |--dataset-dir )((?:runs|datasets)/[\w-]+)", text)


@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path):
    """Every bash block of the README exits 0 against a simulated fleet, and each run directory and dataset
    it names is there afterwards."""
    from procs import sim_fleet

    blocks = bash_blocks(README.read_text())
    assert len(blocks) >= 5, blocks
    root = scratch_root(tmp_path)
    with sim_fleet(2) as servers:
        run_blocks(blocks, root, servers)
    made = made_dirs(blocks)
    assert {"runs/my-run", "runs/json", "runs/regen", "datasets/regen", "datasets/nightly"} <= set(made), made
    for out in made:
        assert (root / out).is_dir(), out


@pytest.mark.slow
def test_the_docs_recipes_run_as_written(tmp_path):
    """Every bash block of the recipe pages (thinking off, best-of-n, draft-model data) exits 0 against a
    simulated fleet, and each run directory and dataset it names is there afterwards."""
    from procs import sim_fleet

    blocks = [b for page in RECIPE_PAGES for b in bash_blocks((DOCS / page).read_text())]
    assert len(blocks) >= 4, blocks
    root = scratch_root(tmp_path)
    with sim_fleet(2) as servers:
        run_blocks(blocks, root, servers)
    for out in made_dirs(blocks):
        assert (root / out).is_dir(), out
