"""Every JSON-RPC message gets the answer the JSON-RPC 2.0 and LSP specifications give it.

pygls turns a body into a message inside `json.loads` and drops whatever fails there (bad
JSON, a missing `jsonrpc`, params its types refuse) without a response, so the editor waits
forever; it also serves requests before `initialize`, accepts a second `initialize`, and drops
requests after `shutdown` in silence. `TabloopProtocol.receive` checks each body first:

- not JSON: -32700 ParseError, id null;
- not a JSON-RPC 2.0 request, notification or response: -32600 InvalidRequest, with the id when
  it is an integer or a string (else null);
- params that are not an object or array, or that the method's lsprotocol type refuses (a
  negative line, one past 2^31-1): -32602 InvalidParams with the id; a notification is dropped;
- a request before `initialize`: -32002 ServerNotInitialized (notifications are dropped, `exit`
  is served);
- a second `initialize`, or any request after `shutdown`: -32600 InvalidRequest.

Only what passes reaches pygls's `handle_message`, already structured.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Generator
from typing import Any

import attrs
from cattrs import transform_error
from cattrs.errors import ClassValidationError, IterableValidationError
from lsprotocol import types
from pygls.protocol import (
    JsonRPCNotification,
    JsonRPCRequestMessage,
    LanguageServerProtocol,
    lsp_method,
)

from lsp_server.framing import INVALID_REQUEST, PARSE_ERROR, Refusal, readable_id

log = logging.getLogger(__name__)

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = types.ErrorCodes.ServerNotInitialized.value


class TabloopProtocol(LanguageServerProtocol):
    """pygls's LSP protocol, with every message checked before pygls handles it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initialize_received = False
        self.shutdown_received = False
        # `capabilities.experimental` of the `initialize` answer; features fill it in while
        # the server's `initialize` handler resolves their settings.
        self.experimental: dict[str, Any] = {}

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(
        self, params: types.InitializeParams
    ) -> Generator[Any, Any, types.InitializeResult]:
        """pygls's `initialize`, with the features' experimental capabilities added."""
        result: types.InitializeResult = yield from super().lsp_initialize(params)
        if self.experimental:
            result.capabilities.experimental = dict(self.experimental)
        return result

    def send_error(self, msg_id: int | str | None, code: int, message: str) -> None:
        """An error response; built here because lsprotocol leaves out an id that is null."""
        self._send_data(
            {
                "jsonrpc": self.VERSION,
                "id": msg_id,
                "error": {"code": code, "message": message},
            }
        )

    def refuse(self, refusal: Refusal) -> None:
        """Answer a frame the reader could not deliver."""
        self.send_error(refusal.msg_id, refusal.code, refusal.message)

    def receive(self, body: bytes) -> bool:
        """Check one frame's body and hand it to pygls, or answer with the error it earns.

        False when the body was refused (answered with an error or dropped).
        """
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            log.warning("a message is not JSON: %s", exc)
            self.send_error(None, PARSE_ERROR, f"the message is not JSON: {exc}")
            return False
        msg_id = readable_id(data)
        if not isinstance(data, dict):
            self.send_error(None, INVALID_REQUEST, "a message must be a JSON object")
            return False
        if data.get("jsonrpc") != self.VERSION:
            self.send_error(msg_id, INVALID_REQUEST, 'a message needs "jsonrpc": "2.0"')
            return False
        if "method" in data:
            return self._receive_call(data, msg_id)
        elif "id" in data and ("result" in data or "error" in data):
            return self._receive_response(data)
        else:
            self.send_error(msg_id, INVALID_REQUEST, "neither a request nor a response")
        return False

    def _receive_call(self, data: dict[str, Any], msg_id: int | str | None) -> bool:
        """A request (it has an id) or a notification."""
        method = data["method"]
        is_request = "id" in data
        if not isinstance(method, str) or (is_request and msg_id is None):
            self.send_error(msg_id, INVALID_REQUEST, "method must be a string, id one too or int")
            return False
        refusal = self._lifecycle_refusal(method, is_request)
        if refusal is not None:
            if is_request:
                self.send_error(msg_id, *refusal)
            else:
                log.info("dropped the notification %s: %s", method, refusal[1])
            return False
        params = data.get("params")
        problem = None
        if params is not None and not isinstance(params, dict | list):
            problem = "params must be an object or an array"
        else:
            try:
                message = self._structure_call(data, method, is_request)
            except Exception as exc:
                problem = f"invalid params for {method}: {describe(exc)}"
        if problem is not None:
            if is_request:
                self.send_error(msg_id, INVALID_PARAMS, problem)
            else:
                log.warning("dropped the notification %s: %s", method, problem)
            return False
        if is_request and method == types.INITIALIZE:
            self.initialize_received = True
        elif is_request and method == types.SHUTDOWN:
            self.shutdown_received = True
        try:
            self.handle_message(message)
        except Exception as exc:
            # lsprotocol lets some wrong types through (a list as `$/cancelRequest`'s id), and
            # pygls then fails outside any handler: the caller still gets its one answer.
            log.error("could not handle %s", method, exc_info=True)
            if is_request:
                self.send_error(msg_id, INTERNAL_ERROR, f"could not handle {method}: {exc}")
            return False
        return True

    def _structure_call(self, data: dict[str, Any], method: str, is_request: bool) -> Any:
        """The call as lsprotocol's type for its method, or pygls's generic one.

        Only the envelope's own fields are passed on: pygls's generic types take no others,
        and a stray `error` key would make pygls read a request as a response.
        """
        fields = {"jsonrpc": data["jsonrpc"], "method": method, "params": data.get("params")}
        if is_request:
            fields["id"] = data["id"]
        kind = self.get_message_type(method)
        # A method of the other kind (a notification's name sent with an id) is generic here,
        # so pygls answers it as an unknown request instead of dropping it.
        if kind is None or ("id" in attrs.fields_dict(kind)) != is_request:
            kind = JsonRPCRequestMessage if is_request else JsonRPCNotification
        return self._converter.structure(fields, kind)

    def _lifecycle_refusal(self, method: str, is_request: bool) -> tuple[int, str] | None:
        """Why the server's lifecycle state refuses this call now, or None."""
        if method == types.EXIT:
            return None
        if method == types.INITIALIZE and is_request:
            if self.initialize_received:
                return INVALID_REQUEST, "the server is initialized already"
            return None
        if not self.initialize_received:
            return SERVER_NOT_INITIALIZED, "the server is not initialized yet"
        if self.shutdown_received:
            return INVALID_REQUEST, "the server is shutting down"
        return None

    def _receive_response(self, data: dict[str, Any]) -> bool:
        """The client's answer to one of our requests; a broken one is logged and dropped."""
        try:
            message = self.structure_message(data)
        except Exception:
            log.warning("dropped a response the server cannot read: %.200r", data, exc_info=True)
            return False
        try:
            self.handle_message(message)
        except Exception:
            log.error("could not handle a response: %.200r", data, exc_info=True)
            return False
        return True


def describe(exc: BaseException) -> str:
    """What cattrs found wrong, field by field where it can say (`$.position.line: ...`)."""
    cause = exc.__cause__ or exc
    if isinstance(cause, ClassValidationError | IterableValidationError):
        return "; ".join(transform_error(cause))
    return str(cause)
