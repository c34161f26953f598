"""The show/silence policy: a `PolicyClient` built when the settings change, read per request.

The engine asks `PolicyFeature.current` for the policy on every request, on the model thread.
That read is one attribute load and the client's own lock-free `current()`: no lock, no settings
comparison, no construction. The client is built, or replaced, only on the settings path
(`follow`, called by the lifecycle feature when the engine loads and when the configuration
changes); replacing it is one attribute assignment, which a concurrent reader sees whole.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from lsp_server.config import Settings
from lsp_server.server import TabloopServer

if TYPE_CHECKING:
    from completion.gate import Policy
    from completion.policy_client import PolicyClient

log = logging.getLogger(__name__)

ClientKey = tuple[object, ...]


def client_key(settings: Settings) -> ClientKey:
    """The settings a policy client is built from; another key needs another client."""
    return (
        settings.backend.url,
        settings.backend.token,
        settings.policy.refresh_s,
        settings.policy.show_floor,
    )


class PolicyFeature:
    """Owns the server's `PolicyClient`."""

    def __init__(self) -> None:
        self.client: PolicyClient | None = None
        self._key: ClientKey | None = None
        self._builtin: Policy | None = None
        # Only `follow` and `close` take it, so two settings changes never build two clients.
        self._lock = threading.Lock()

    def current(self) -> Policy:
        """The policy to decide with now (the engine's policy source; runs per request)."""
        client = self.client
        if client is not None:
            return client.current()
        # Not built yet (the engine builds it first, so only direct use gets here).
        if self._builtin is None:
            from completion.gate import builtin_policy

            self._builtin = builtin_policy()
        return self._builtin

    def follow(self, settings: Settings) -> PolicyClient:
        """Build the client for `settings` unless the current one fits; close the one replaced.

        Without a backend the client serves the last cached policy, or the built-in one. Call
        this off the event loop: the policy module imports torch.
        """
        from completion.policy_client import PolicyClient

        key = client_key(settings)
        with self._lock:
            client = self.client
            if client is not None and self._key == key:
                return client
            fresh = PolicyClient(
                settings.backend.url or None,
                settings.backend.token or None,
                settings.cache_path() / "policy",
                settings.policy.refresh_s,
                show_floor=settings.policy.show_floor,
            )
            fresh.start()
            self.client, self._key = fresh, key
        if client is not None:
            client.close()  # readers that took it a moment ago still get its last policy
        log.debug("policy client for %s", settings.backend.url or "no backend")
        return fresh

    def close(self) -> None:
        with self._lock:
            client, self.client, self._key = self.client, None, None
        if client is not None:
            client.close()


def register(server: TabloopServer) -> None:
    feature = server.add_feature(PolicyFeature())
    server.hooks.shutdown.append(feature.close)
