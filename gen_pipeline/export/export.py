"""`gen-pipeline export`: run directories become a training dataset.

    gen-pipeline export runs/nightly --out datasets/nightly --drop-truncated \\
        --columns id,finish_reason,prompt_tokens,completion_tokens,model,meta.source_id

One row per completion (per sample of a prompt, with its `sample` column): `messages` (the prompt turns
plus the new assistant turn) and the chosen columns; `--group-samples` makes one row per prompt with the
list of its completions (see grouped.py). Written as Parquet shards under OUT/data/ (the hub's layout)
or, with --save-to-disk, as a `datasets` folder; OUT/README.md is a dataset card with the counts and the
generation settings. Nothing in the run directory is changed; a torn last line is skipped, and an
(id, sample) seen twice from the same checkpoint with the same prompt is exported once (another prompt under
it is no duplicate: refused, naming the ids, or kept with --keep-colliding-ids): the answers of different checkpoints to
the same ids (two runs over the same prompts, an A/B of two teachers) are all kept, side by side, with the
`checkpoint` column naming each row's (export refuses runs of several checkpoints without that column;
`--group-samples` groups within a checkpoint). A claimed-shard run (shards/claims.py) is checked as a whole: it is
refused while shards are open (unless --partial), and a key found twice in its shard files is an error
that names the keys (the claim protocol writes each key once; two copies mean the protocol was broken).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import ExportCheckError
from ..fleet.provenance import unnamed_checkpoints
from ..rundir.locks import FileLock, is_held
from ..views.rundata import read_manifest
from .card import dataset_card
from .exportconfig import COLUMN_TYPES, REQUEST_COLUMNS, TRAINER_FORMATS, ExportConfig, ExportStats
from .lines import answered_rows, kept_completions
from .trainrow import server_kind, training_row, turn_features


def check_settled(config: ExportConfig) -> None:
    """Refuse a claimed-shard run whose shards are not all settled (unless --partial)."""
    from ..views.claimstatus import open_shards

    for run in config.runs:
        manifest = read_manifest(run)
        if manifest.get("shards") is None or config.partial:
            continue
        if left := open_shards(run, manifest):
            raise ExportCheckError(
                f"{run}: {left} of {manifest['shards']} shards are not settled; finish the run "
                "(the same generate command, or more claimers), or export what is there with --partial"
            )


def training_rows(config: ExportConfig, stats: ExportStats) -> Iterator[dict[str, Any]]:
    """Every exportable completion as a training row (or, with group_samples, every prompt's group; of a
    --turns all run, every conversation)."""
    kind = server_kind(config)
    if config.group_samples:
        from .grouped import grouped_rows

        yield from grouped_rows(kept_completions(config, stats), config.columns, kind, stats)
        return
    for obj, extra in answered_rows(config, stats):
        yield {**training_row(obj, config.columns, kind), **extra}


def build_dataset(config: ExportConfig, stats: ExportStats, cache_dir: Path, in_memory: bool = False) -> Any:
    """The dataset, streamed to Arrow files under `cache_dir` (never the whole run in memory), then read
    from there, or into memory."""
    import datasets

    rows: Any = training_rows
    if config.format in TRAINER_FORMATS:
        from .trainerrows import trainer_features, trainer_rows

        features, rows = trainer_features(config), trainer_rows
    elif config.turns:
        from .turnexport import conversation_features

        features = conversation_features(config.columns, COLUMN_TYPES)
    elif config.group_samples:
        from .grouped import grouped_features

        features = grouped_features(config.columns, COLUMN_TYPES)
    else:
        features = datasets.Features(
            {
                "messages": [turn_features()],
                **dict.fromkeys(REQUEST_COLUMNS, datasets.Value("string")),
                **{c: datasets.Value(COLUMN_TYPES.get(c, "string")) for c in config.columns},
            }
        )
    kwargs = {"config": config, "stats": stats}
    try:
        return datasets.Dataset.from_generator(
            rows, gen_kwargs=kwargs, features=features, cache_dir=str(cache_dir), keep_in_memory=in_memory
        )
    except ValueError:
        if stats.written:
            raise
        # datasets refuses to build an empty split from a generator
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)


def write_dataset(ds: Any, out: Path, config: ExportConfig) -> None:
    """Parquet shards under out/data/, or a save_to_disk folder."""
    if config.save_to_disk:
        ds.save_to_disk(str(out))
        return
    shards = max(1, -(-len(ds) // config.shard_rows))
    (out / "data").mkdir(parents=True)
    for i in range(shards):
        part = ds.shard(shards, i, contiguous=True)
        part.to_parquet(str(out / "data" / f"train-{i:05d}-of-{shards:05d}.parquet"))


def checked(config: ExportConfig) -> None:
    """Refuse what export refuses before it reads a line: open shards, unnamed checkpoints side by side."""
    check_settled(config)
    if (refused := unnamed_checkpoints([read_manifest(run) for run in config.runs], config.columns)) is not None:
        raise ExportCheckError(refused)


def export(config: ExportConfig) -> ExportStats:
    """Build the dataset and its card in a temporary folder, then move it to `config.out`."""
    checked(config)
    config.out.parent.mkdir(parents=True, exist_ok=True)
    stats = ExportStats()
    with staging(config.out) as tmp:
        if config.format == "openai-batch":
            _stage_batch(config, stats, Path(tmp) / "out")
            return stats
        if config.format in TRAINER_FORMATS:
            _stage_trainer(config, stats, Path(tmp) / "out")
            return stats
        ds = build_dataset(config, stats, Path(tmp) / "cache")
        if (why := unsure(stats, config)) is not None:
            del ds
            raise ExportCheckError(why)
        staged = Path(tmp) / "out"
        stats.written = len(ds)
        write_dataset(ds, staged, config)
        if config.rejected:
            from .rejects import write_rejected

            write_rejected(config, stats, staged, Path(tmp) / "rejected-cache")
        (staged / "README.md").write_text(dataset_card(config, stats), encoding="utf-8")
        if config.push_to_hub:
            push(ds, staged / "README.md", config)
        del ds
        _move(staged, config.out)
    return stats


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out`, locked while this export runs (.export-*/.lock); the folders killed
    exports left there (their lock held by nobody) are removed first. A folder without a lock is left as it is
    (an older version's, maybe at work)."""
    for left in out.parent.glob(".export-*"):
        if is_held(left / ".lock") is False:
            shutil.rmtree(left, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".export-") as tmp:
        lock = FileLock(Path(tmp) / ".lock", " (export)")
        lock.acquire()
        try:
            yield Path(tmp)
        finally:
            lock.release()


def _move(staged: Path, out: Path) -> None:
    """The staged output into place, replacing what was there (--overwrite)."""
    if out.exists():
        shutil.rmtree(out)
    staged.rename(out)


def unsure(stats: ExportStats, config: ExportConfig) -> str | None:
    """Why an export cannot tell which line is a key's, if it cannot: a claimed-shard run wrote a key twice, or
    the runs hold different prompts under one (id, sample) (unless --keep-colliding-ids)."""
    if stats.twice:
        return f"{len(stats.twice)} keys are in the run's shard files more than once: {_first(stats.twice)}"
    if stats.collided and not config.keep_colliding_ids:
        return (
            f"{len(stats.collided)} (id, sample) keys hold different prompts in these runs, so they are not "
            f"duplicates: {_first(stats.collided)}. Export the runs apart, or add --keep-colliding-ids to keep "
            "every one of them (the dataset then has rows that share an id)"
        )
    return None


def refuse_unsure(stats: ExportStats, config: ExportConfig) -> None:
    """ExportCheckError when `unsure` says why."""
    if (why := unsure(stats, config)) is not None:
        raise ExportCheckError(why)


def _first(named: list[str]) -> str:
    return "; ".join(named[:5]) + (f"; and {len(named) - 5} more" if len(named) > 5 else "")


def _stage_batch(config: ExportConfig, stats: ExportStats, staged: Path) -> None:
    """--format openai-batch: the output and error files, staged, then moved to `config.out`."""
    from .batchexport import write_batch

    stats.written, stats.ledgered = write_batch(config, staged, _counted(stats, kept_completions(config, stats)))
    refuse_unsure(stats, config)
    _move(staged, config.out)


def _stage_trainer(config: ExportConfig, stats: ExportStats, staged: Path) -> None:
    """--format conversations / text: OUT/train.jsonl and the card, staged, then moved to `config.out`."""
    from .trainerrows import TRAIN_FILE, trainer_rows, write_lines

    staged.mkdir()
    write_lines(trainer_rows(config, stats), staged / TRAIN_FILE)
    refuse_unsure(stats, config)
    (staged / "README.md").write_text(dataset_card(config, stats), encoding="utf-8")
    _move(staged, config.out)


def _counted(stats: ExportStats, lines: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for obj in lines:
        stats.add(obj)
        yield obj


def push(ds: Any, card: Path, config: ExportConfig) -> None:
    """Push the dataset and its card to the hub (needs a token and network)."""
    from huggingface_hub import HfApi

    assert config.push_to_hub is not None
    ds.push_to_hub(config.push_to_hub, private=config.private)
    api = HfApi()
    api.upload_file(
        path_or_fileobj=str(card), path_in_repo="README.md", repo_id=config.push_to_hub, repo_type="dataset"
    )
