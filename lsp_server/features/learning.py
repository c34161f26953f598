"""The model learns in the server: keeping what users did with suggestions.

Every shown suggestion whose outcome becomes known (accepted, partially accepted, ignored,
dismissed) is kept with its context in the local feedback store (`training.feedback`: bounded,
in the cache directory, never sent), under the server's workspace, where `tabloop train model`
for that workspace finds it. Superseded and unseen suggestions say nothing about the suggestion
and are not kept; nor is anything when the server has no workspace root (no workspace's adapter
could learn from it). The adapters trained from it are served by
`lsp_server.features.adapters`. An accepted suggestion's row keeps the text the user kept in its
place, updated at its first retention checkpoint (edits included), which judges the next adapter.

Each row carries the model version that wrote the suggestion, and while the workspace's adapter
registry runs a canary, it is judged from these rows every `CANARY_EVERY` rows kept
(`training.local_canary`): promoted, or rolled back when its suggestions fare worse.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from completion.types import CompletionRequest, Decision
from lsp_server.config import Settings
from lsp_server.features.adapters import AdapterFeature
from lsp_server.server import TabloopServer
from telemetry.events import OutcomeEvent
from training.feedback import FEEDBACK_FILE, FeedbackRecorder, FeedbackStore
from training.local_canary import settle_local_canary
from training.registry import REGISTRY_FILE, workspace_key

log = logging.getLogger(__name__)

CANARY_EVERY = 25
"""Rows kept between two judgements of a workspace's running canary."""


class LearningFeature:
    """Owns the feedback store."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self.store: FeedbackStore | None = None
        self._recorder = FeedbackRecorder()
        self._kept = 0

    def on_settings(self, settings: Settings) -> None:
        wanted = settings.completion.feedback_rows
        path = settings.cache_path() / FEEDBACK_FILE
        root = self.server.workspace_root
        workspace = workspace_key(root) if root is not None else None
        if self.store is not None and (
            wanted == 0 or self.store.path != path or self.store.workspace != workspace
        ):
            self.store.close()
            self.store = None
        if wanted > 0 and self.store is None and root is None:
            log.info("not keeping feedback: the server has no workspace root")
        elif wanted > 0 and self.store is None:
            try:
                self.store = FeedbackStore(path, max_rows=wanted, workspace=root)
            except Exception:
                log.warning("not keeping feedback: could not open %s", path, exc_info=True)
        elif self.store is not None:
            self.store.max_rows = wanted

    def on_decision(self, decision: Decision, request: CompletionRequest) -> None:
        if self.store is not None:
            adapters = self.server.find_feature(AdapterFeature)
            version = adapters.version_of(decision) if adapters is not None else None
            self._recorder.shown(decision, request, version)

    def on_outcome(self, event: OutcomeEvent) -> None:
        kept = self._recorder.settled(event)
        store = self.store
        if kept is None or store is None:
            return
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, store.record, kept)
        future.add_done_callback(_log_failure)
        self._kept += 1
        if self._kept % CANARY_EVERY == 0:
            loop.run_in_executor(None, self.judge_canary, store).add_done_callback(_log_failure)

    def on_kept(self, decision_id: str, text: str) -> None:
        """The text the user kept in place of an accepted suggestion: onto its row."""
        if self.store is not None:
            future = asyncio.get_running_loop().run_in_executor(
                None, self.store.keep_text, decision_id, text
            )
            future.add_done_callback(_log_failure)

    def judge_canary(self, store: FeedbackStore) -> dict[str, object] | None:
        """Judge the workspace's running adapter canary on its feedback (a worker thread)."""
        adapters = self.server.find_feature(AdapterFeature)
        registry = adapters.registry() if adapters is not None else None
        if registry is None or not (registry.root / REGISTRY_FILE).is_file():
            return None
        return settle_local_canary(registry, store)

    def on_shutdown(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None


def _log_failure(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("feedback: %s", future.exception())


def register(server: TabloopServer) -> None:
    feature = server.add_feature(LearningFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.decision.append(feature.on_decision)
    server.hooks.outcome.append(feature.on_outcome)
    server.hooks.kept.append(feature.on_kept)
    server.hooks.shutdown.append(feature.on_shutdown)
