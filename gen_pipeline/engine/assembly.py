"""What both modes wire the same way around a Runner, built in one place: the pool over the settled fleet, the
request path (with the offset it learns), the sample dispatch (with the thinking-budget field) and the run's
warnings.

Each mode adds its own feed, sink and tracker (runner.py's Protocols): the single-process mode (single.py) a
reader of the whole input, the run directory's writer and the input cursor; a claimer (shards/run.py) its claims'
feed, writer and tracker, and a status file of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..fleet.balancer import ServerPool
from ..fleet.discovery import FleetInfo
from ..http import Client
from ..progress.stats import RunStats
from ..resume.cursor import InputCursor
from ..send.dispatch import SampleDispatch, thinking_fields
from ..send.requests import RequestPath
from ..tokens import TokenCounter
from ..tokens.budget import OffsetLearner
from .runner import Feed, Runner, Sink, Tracker
from .setup import build_pool


@dataclass
class Assembly:
    """The collaborators a Runner shares with nothing else but builds the same way in either mode."""

    config: RunConfig
    client: Client
    counter: TokenCounter
    stats: RunStats
    pool: ServerPool
    path: RequestPath
    dispatch: SampleDispatch
    warnings: list[str]

    @classmethod
    def build(
        cls,
        config: RunConfig,
        client: Client,
        counter: TokenCounter,
        fleet: FleetInfo,
        model: str,
        context_length: int,
        stats: RunStats,
    ) -> Assembly:
        """The collaborators of a run on `fleet` (settled: its model and context known). A --thinking-budget the
        fleet has no request field for is refused first (ConfigError), before anything is built."""
        extra = thinking_fields(config, fleet)
        pool = build_pool(config, fleet)
        learner = OffsetLearner()
        path = RequestPath(config, client, pool, model, context_length, learner, stats, fleet.input_limit())
        warnings: list[str] = []
        dispatch = SampleDispatch(path, extra, warnings.append)
        return cls(config, client, counter, stats, pool, path, dispatch, warnings)

    def runner(
        self,
        sink: Sink,
        feed: Feed,
        tracker: Tracker,
        cursor: InputCursor | None = None,
        status_path: Path | None = None,
        status_extra: Callable[[], dict[str, Any]] | None = None,
        stopping: asyncio.Event | None = None,
    ) -> Runner:
        """The Runner over these collaborators and the mode's own feed, sink and tracker (`stopping`: an event
        the mode watches too; `status_path`, `status_extra`: where and what the status snapshots write)."""
        return Runner(
            self.config,
            self.counter,
            self.path,
            self.pool,
            sink,
            self.stats,
            feed,
            tracker,
            cursor,
            self.client,
            self.dispatch,
            status_path,
            status_extra,
            warnings=self.warnings,
            stopping=stopping if stopping is not None else asyncio.Event(),
        )
