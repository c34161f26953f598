"""Prefetch after a suggestion is shown: the answer for the cursor that accepting it leads to.

When the user accepts with Tab, the editor asks again at once, at the end of the inserted text.
While the user reads the suggestion, the model thread is idle; it computes that next answer into
the engine's cache (`Engine.prefetch`), so the request after Tab is answered without a model call.
Anything else the user does (an edit that is not the suggestion's text arriving, a request at
another cursor, closing the document) cancels the prefetch within one token.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from completion.types import Cancelled, CancelToken, CompletionRequest, Decision
from lsp_server.documents import DocumentChange, DocumentListener, open_document

if TYPE_CHECKING:
    from lsp_server.server import TabloopServer

log = logging.getLogger(__name__)


@dataclass
class _Job:
    request: CompletionRequest  # where the suggestion was shown
    text: str  # the suggestion
    token: CancelToken
    future: asyncio.Future[bool] | None = None
    done: bool = field(default=False)

    @property
    def target(self) -> CompletionRequest:
        return self.request.after_inserting(self.text)

    def reached_by(self, request: CompletionRequest) -> bool:
        """Whether `request` is at the cursor this prefetch computes for."""
        return (
            request.uri == self.request.uri
            and request.suffix == self.request.suffix
            and request.prefix == self.request.prefix + self.text
        )

    def still_ahead(self, source: str) -> bool:
        """Whether the document `source` can still become the accepted state.

        True while it holds the request's prefix, some leading part of the suggestion, and the
        suffix: the acceptance (or typing through it) is under way.
        """
        prefix, suffix = self.request.prefix, self.request.suffix
        middle_len = len(source) - len(prefix) - len(suffix)
        if middle_len < 0 or middle_len > len(self.text):
            return False
        if not (source.startswith(prefix) and source.endswith(suffix)):
            return False
        return self.text.startswith(source[len(prefix) : len(prefix) + middle_len])


class PrefetchFeature(DocumentListener):
    """At most one prefetch per document, cancelled by anything but the acceptance."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self._jobs: dict[str, _Job] = {}
        self.started = 0
        self.used = 0
        self.cancelled = 0

    def status_parts(self) -> dict[str, int]:
        return {
            "prefetchStarted": self.started,
            "prefetchUsed": self.used,
            "prefetchCancelled": self.cancelled,
        }

    def start(self, decision: Decision, request: CompletionRequest) -> None:
        """Prefetch the answer after `decision` is accepted (when enabled and worth it)."""
        server = self.server
        engine = server.engine
        if engine is None or not server.settings.completion.prefetch or not decision.shown:
            return
        self._cancel(request.uri)
        job = _Job(request, decision.text, CancelToken())
        loop = asyncio.get_running_loop()
        job.future = loop.run_in_executor(
            server.model_executor, self._run, engine, request, decision.text, job.token
        )
        job.future.add_done_callback(lambda _f: setattr(job, "done", True))
        self._jobs[request.uri] = job
        self.started += 1

    @staticmethod
    def _run(engine: object, request: CompletionRequest, text: str, token: CancelToken) -> bool:
        try:
            return bool(engine.prefetch(request, text, token))  # type: ignore[attr-defined]
        except Cancelled:
            return False
        except Exception:
            log.exception("prefetch failed")
            return False

    async def before_request(self, request: CompletionRequest) -> None:
        """Called before a request is computed: wait for its prefetch, cancel all others."""
        for uri in list(self._jobs):
            job = self._jobs[uri]
            if job.reached_by(request) and not job.token.cancelled:
                del self._jobs[uri]
                if job.future is not None:
                    cached = await asyncio.shield(job.future)
                    if cached:
                        self.used += 1
                continue
            self._cancel(uri)

    def _cancel(self, uri: str) -> None:
        job = self._jobs.pop(uri, None)
        if job is not None and not job.done:
            job.token.cancel("the user moved on")
            self.cancelled += 1

    # -- documents (a DocumentListener) ---------------------------------------------------

    def did_change(self, change: DocumentChange) -> None:
        uri = change.uri
        job = self._jobs.get(uri)
        if job is None:
            return
        document = open_document(self.server.workspace, uri)
        if document is None or not job.still_ahead(document.source):
            self._cancel(uri)

    def did_close(self, uri: str) -> None:
        self._cancel(uri)


def register(server: TabloopServer) -> PrefetchFeature:
    feature = PrefetchFeature(server)
    server.add_feature(feature)
    server.hooks.documents.append(feature)
    return feature
