"""Reading for a run: rows a batch at a time, validated, resume-filtered, within --limit, with
--system-prompt, counted in a worker thread (the tokenizer thread)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator, Iterator

from ..config import RunConfig
from ..digests import shaping_key
from ..inputs.rows import BadRow, RowError
from ..inputs.shape import RowShape
from ..inputs.source import PromptSource, Skipped, skipped
from ..progress.stats import RunStats
from ..records import Prompt
from ..resume.changes import RecordedPrompts, changed_samples, next_generations, same_row
from ..resume.cursor import CursorLog, Mark, Resumed, mark_of
from ..resume.settled import Conversations, ResumeState
from ..samples import place_key
from ..send.turns import TurnHistory, recorded_history, split_turns, stale
from ..tokens import TokenCounter
from ..tokens.conversation import ChatInput, Conversation
from ..tokens.oversize import SizeFloor
from .workload import start_count

log = logging.getLogger("gen_pipeline")


MAX_BATCH_ITEMS = 16384  # skipped rows one read tallies before it hands over


class BatchReader:
    """Reads, validates, resume-filters and counts rows a batch at a time, in a worker thread.

    With a `resumed` input cursor it starts at the cursor's mark, handing over the rows before it as
    one tally per reason.
    """

    def __init__(
        self,
        config: RunConfig,
        counter: TokenCounter,
        resume: ResumeState,
        stats: RunStats,
        resumed: Resumed | None = None,
        context_length: int | None = None,
        mine: Callable[[int], bool] | None = None,  # a claimer's held shards (None: every row)
        retired: frozenset[str] = frozenset(),  # checkpoints no longer serving (fleet.provenance.retired)
    ) -> None:
        start = resumed.start if resumed else None
        shape = RowShape.of(config.template, config.turns)
        self.rows = resume.rows(config.retry_failed, resumed.prior if resumed else None)  # is a row settled?
        self.log = CursorLog()  # what the pass met, for the input cursor (single.py's InputCursor)
        # an answered row is read too (parse_done), to tell whether its prompt changed since (resume/changes.py)
        # ... parsed unless its line's row digest says it was answered from the same bytes (digests.py)
        self.source = PromptSource(
            config.input, self.rows, mine, start, shape, self.log, True, self._same_row, shaping_key(config)
        )
        self.carried = dict(resumed.tallies) if resumed else {}
        self.started = {"line": start.line, "bytes": start.offset} if start else None  # where reading began
        self.limit, self.config = config.limit, config
        self.items: Iterator[Prompt | BadRow | Skipped] = first_lines(self.source, self.limit)
        self.counter = counter
        self.resume = resume
        self.retry = config.retry_failed
        self.samples = config.samples
        self.batch = config.tokenize_batch
        self.name = config.input.name
        self.stats = stats
        # rows whose size alone puts them over this many input tokens are over_length without a count
        self.fit = context_length - config.safety_margin - config.min_tokens if context_length else None
        self.floor = SizeFloor(counter)
        self.history = TurnHistory(config.out / name for name in resume.files)
        self.retired = retired  # --turns all: a conversation they answered is answered again, not gone on
        self.work = stats.work
        self.work.counts_for(config.turns, config.samples)
        self.work.carried_rows = sum(self.carried.values())
        self.cursor_at = start.offset if start else 0
        self.counting: threading.Thread | None = None  # the bar's total, counted beside the run (workload.py)
        self.recorded = RecordedPrompts(config.out / name for name in resume.files)

    def hold_cursor(self) -> None:
        """A row failed for a transient reason: the input cursor stops short of it."""
        self.log.stop()

    def next_batch(self) -> tuple[list[Prompt | BadRow | Skipped], Mark]:
        """Up to `batch` rows that need a count, plus what was bad on the way and one Skipped per reason
        counting the rows skipped on the way (a resume skips 650k rows without handing over each); and
        the input position after them."""
        out: list[Prompt | BadRow] = []
        prompts: list[Prompt] = []
        tally, self.carried = self.carried, {}
        n_skipped = 0
        for item in self.items:
            settled = self._settle(item)
            if isinstance(settled, Skipped):
                tally[settled.reason] = tally.get(settled.reason, 0) + 1
                n_skipped += 1
                if n_skipped >= MAX_BATCH_ITEMS:
                    break  # a long settled stretch: hand it over, so progress moves
                continue
            out.append(settled)
            if isinstance(settled, Prompt):
                prompts.append(shaped(settled, self.config))
                self.stats.note_shape(settled.merged, settled.dropped)
                if len(prompts) >= self.batch:
                    break
        else:
            self.work.read_all = True
        self.stats.repeats = self.source.repeats
        self.stats.input_fraction = self.source.fraction()
        self.stats.unfinished_line = self.source.unfinished or self.stats.unfinished_line
        self.stats.input_error = self.source.read_error or self.stats.input_error
        failed = self._count(prompts)
        if self.config.turns != "all":  # a whole conversation is one row there, its turns sent to one server
            for p in prompts:
                if id(p) not in failed:
                    self.stats.scatter.note(p.messages, p.tools, p.input_tokens)
        counted: list[Prompt | BadRow | Skipped] = []
        for x in out:
            if id(x) in failed:
                assert isinstance(x, Prompt)
                self.log.bad(x.line, x.key)
                bad = self._settle(BadRow(x.line, failed[id(x)], x.id))
                if isinstance(bad, Skipped):  # ledgered by an earlier run: not written twice
                    tally[bad.reason] = tally.get(bad.reason, 0) + 1
                    continue
                x = bad
            counted.append(x)
        self._note_progress(sum(tally.values()) + len(counted))
        if self.counting is None:
            self.counting = start_count(self.config, self.cursor_at, self.work, lambda: self.stats.settled() > 0)
        return [*(Skipped(reason, n) for reason, n in tally.items()), *counted], mark_of(self.source, self.log)

    def _note_progress(self, rows: int) -> None:
        """Tell the stats how many rows were handed over and how much of the input that was (for the ETA)."""
        fraction = self.source.fraction()  # of the compressed bytes, for a compressed file
        if self.limit is not None:
            fraction = max(fraction, self.source.lines / self.limit)
        self.stats.note_input(rows, 1.0 if rows == 0 else min(fraction, 1.0))

    def _settle(self, item: Prompt | BadRow | Skipped) -> Prompt | BadRow | Skipped:
        """A bad row an earlier run already ledgered is skipped (the source skips settled ids itself);
        a prompt gets the samples it still owes, and is skipped when it owes none (resume.settled decides). What
        earlier runs settled counts into the progress's skipped units."""
        if isinstance(item, BadRow):
            item = skipped("bad_input") if self.rows.bad_row(self.name, item.line) else item
        if isinstance(item, Skipped):
            self.work.skipped += item.count * (1 if self.config.turns == "all" else self.samples)
            return item
        if isinstance(item, Prompt):
            k = item.samples or self.samples
            if self.config.turns == "all":
                return self._settle_turns(item, k)
            item.pending, reason = self.rows.owed(item.key, k)
            if len(item.pending) < k:  # answered before: with this prompt?
                shaped(item, self.config)
                self._changed(item, changed_samples(item, k, self.resume, self.recorded, self.retry))
            self.work.skipped += k - len(item.pending)
            if not item.pending:
                return skipped(reason)
            self._spent(item, {s: 0 for s in item.pending})
        return item

    def _same_row(self, key: int, digest: int | None) -> bool:
        """An answered row (the run's samples each) was answered from the very bytes whose digest is `digest`."""
        return digest is not None and same_row(key, digest, self.samples, self.resume, self.recorded, self.retry)

    def _changed(self, item: Prompt, samples: tuple[int, ...]) -> None:
        """Answered samples whose prompt changed since (resume/changes.py): counted and named; with
        --redo-changed, owed again as their next restart generation, from the first turn."""
        if not samples:
            return
        self.stats.changed.note(item.id, self.config.redo_changed)
        if self.config.redo_changed:
            item.restart.update(next_generations(item, samples, self.resume))
            item.pending = tuple(sorted({*item.pending, *samples}))

    def _complete_changed(self, item: Prompt, k: int, found: Conversations) -> tuple[int, ...]:
        """--turns all: the complete conversations whose user (and system) turns are not the row's now."""
        last = len(item.turns or ()) - 1
        changed = []
        for s in range(k):
            if s in found.start or s in found.ended:
                continue
            line = self.history.line(item, s, last, found.restart.get(s, 0))
            if line is not None and stale(line, item.turns or [], frozenset()) == "edited":
                changed.append(s)
        return tuple(changed)

    def _spent(self, item: Prompt, starts: dict[int, int]) -> None:
        """What earlier runs spent on the answers the prompt still owes (sample -> the turn it goes on at)."""
        if self.resume.rejects:
            for s, t in starts.items():
                key = place_key(item.key, s, t, item.restart.get(s, 0))
                if key in self.resume.rejects:
                    item.spent[key] = self.resume.rejects[key]

    def _settle_turns(self, item: Prompt, k: int) -> Prompt | BadRow | Skipped:
        """--turns all: the row's segments, and per sample the turn its conversation goes on at (with the
        history recorded before it); skipped when every conversation is complete or ended."""
        try:
            item.turns = split_turns(item.messages)
        except RowError as exc:
            self.log.bad(item.line, item.key)
            return self._settle(BadRow(item.line, str(exc), item.id))
        item.messages = item.turns[0]  # what is counted here and planned by check: the first turn
        found, reason = self.rows.conversations(item, k)
        shaped(item, self.config)  # the turns as they are sent, to compare with those recorded
        owed_turns = 0
        for s, t in sorted(found.start.items()):
            restart = found.restart.get(s, 0)
            line = self.history.line(item, s, t - 1, restart) if t > 0 else None
            if t > 0 and line is None:
                log.warning("id %r sample %d: turn %d is done but its line was not found; left as it is", item.id, s, t)
                continue
            why = stale(line, item.turns[:t], self.retired) if line is not None else None
            if why is not None:  # never gone on as a hybrid: answered again from turn 0, the next generation
                restart, line = restart + 1, None
                self.stats.note_restart(why, item.id)
            item.pending += (s,)
            if restart:
                item.restart[s] = restart
            if line is not None:
                item.resume[s] = (t, recorded_history(line))
            owed_turns += len(item.turns) - (t if line is not None else 0)  # answered again: every turn
        edited = self._complete_changed(item, k, found)
        self._changed(item, edited)
        owed_turns += len(item.turns) * len(edited) if self.config.redo_changed else 0
        self._spent(item, found.start)
        self.work.skipped += k * len(item.turns) - owed_turns  # done, ended, or left as they are
        return item if item.pending else skipped(reason)

    def _too_long(self, p: Prompt) -> bool:
        """Whether the row's size alone proves it over_length; then its input_tokens is that floor."""
        floor = self.floor.tokens_over(conversation(p), self.fit) if self.fit is not None else None
        if floor is None:
            return False
        p.input_tokens, p.at_least = floor, True
        return True

    def _count(self, prompts: list[Prompt]) -> dict[int, str]:
        """Set each prompt's input_tokens; return why counting failed, by id() of the prompt."""
        failed: dict[int, str] = {}
        prompts = [p for p in prompts if not self._too_long(p)]
        counts = self.counter.count([conversation(p) for p in prompts]) if prompts else []
        for p, n in zip(prompts, counts, strict=True):
            if isinstance(n, int):
                p.input_tokens = n
            else:
                failed[id(p)] = n
        return failed


def first_lines(source: PromptSource, limit: int | None) -> Generator[Prompt | BadRow | Skipped, None, None]:
    """The source's items from its first `limit` lines (--limit; all of them when None)."""
    items = iter(source)
    if limit is None:
        yield from items
        return
    try:
        for item in items:
            if source.lines > limit:
                break
            yield item
            if source.lines >= limit:
                break
    finally:
        items.close()  # type: ignore[attr-defined]  # PromptSource.__iter__ is a generator


def shaped(prompt: Prompt, config: RunConfig) -> Prompt:
    """The row as it is counted and sent: --system-prompt put first, and the run's tools and
    chat_template_kwargs where the row has none of its own (a row's own value replaces the run's); the
    tool_choice it is sent with noted for the count."""
    with_system_prompt(prompt, config.system_prompt)
    if prompt.turns:
        prompt.turns[0] = prompt.messages  # --turns all: the system prompt opens the conversation
    if prompt.tools is None:
        prompt.tools = config.tools
    if prompt.template_kwargs is None:
        prompt.template_kwargs = config.chat_template_kwargs
    prompt.tool_choice = (prompt.sampling or {}).get("tool_choice", config.sampling.get("tool_choice"))
    return prompt


def conversation(prompt: Prompt) -> ChatInput:
    """What the template renders for a row: its messages, with its tools and template kwargs if any."""
    if prompt.tools is None and not prompt.template_kwargs:
        return prompt.messages
    return Conversation(prompt.messages, prompt.tools, prompt.template_kwargs or {}, prompt.tool_choice)


def with_system_prompt(prompt: Prompt, text: str | None) -> Prompt:
    """The row with `text` put first as a system turn, unless it has one already (--system-prompt)."""
    if text is not None and not any(m.get("role") == "system" for m in prompt.messages):
        prompt.messages = [{"role": "system", "content": text}, *prompt.messages]
    return prompt


def input_warnings(config: RunConfig, stats: RunStats) -> list[str]:
    """What the summary says about an input that could not be read whole."""
    warnings = []
    if stats.unfinished_line is not None:
        warnings.append(unfinished_warning(config, stats.unfinished_line))
    if stats.input_error is not None:
        warnings.append(f"{stats.input_error}; every row before that point is settled")
    return warnings


def unfinished_warning(config: RunConfig, line: int) -> str:
    """What the summary (and `check`, before the run) says of a last line left unread."""
    return (
        f"line {line} of {config.input.name} has no newline at its end and is not whole JSON: left unread, as a "
        "producer may still be writing it; it is read by the next run once it ends in a newline"
    )
