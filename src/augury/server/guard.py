"""The guard in front of every route: request framing, Host, Origin, draining, the API key and Content-Type.

It reads the raw ASGI headers, so it sees what a dict of headers would hide:
a header sent twice, and a body framed two ways. Everything it refuses gets
the same OpenAI-style error body as the handlers' refusals (`error_response`).
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from augury.server.replies import shutting_down
from augury.server.schemas import ApiError
from augury.server.state import ServerState

PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def error_response(error: ApiError) -> JSONResponse:
    """The HTTP response of a refusal: its status, OpenAI's error body and any headers it carries."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def split_host(value: str) -> tuple[str, int | None]:
    """'Name:port' (or '[::1]:port', or without a port) -> (lowercased name, port or None)."""
    value = value.strip().lower()
    if value.count(":") > 1 and not value.startswith("["):  # a bare IPv6 address
        return value, None
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        name, colon, port = value.rpartition(":")
        if not colon or not port.isdigit():
            name, port = value, ""
    return name, int(port) if port.isdigit() else None


def bearer_token(value: bytes) -> bytes | None:
    """The credentials of an 'Authorization: Bearer TOKEN' value; None for another scheme.

    The scheme is case-insensitive (RFC 7235 section 2.1: 'bearer' is 'Bearer'),
    and one or more spaces may follow it.
    """
    scheme, space, token = value.partition(b" ")
    if not space or scheme.lower() != b"bearer":
        return None
    return token.lstrip(b" ")


def framing_error(raw_headers: list[tuple[bytes, bytes]]) -> ApiError | None:
    """A 400 for a request whose body is framed both by Content-Length and by Transfer-Encoding.

    HTTP/1.1 lets Transfer-Encoding win (RFC 9112 section 6.3), but a proxy in
    front that trusts Content-Length then reads a different request boundary
    than this server: the gap is where a smuggled request hides. Hardened
    servers refuse such a request and close the connection; so does this one,
    before reading a byte of the body.
    """
    names = {name.lower() for name, _ in raw_headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        return ApiError(400, "the request has both Content-Length and Transfer-Encoding headers; send one "
                        "(a body framed two ways can smuggle a request past a proxy)", code="ambiguous_framing",
                        headers={"Connection": "close"})
    return None


class Guard:
    """ASGI middleware in front of every route: who may call, and what the server still accepts.

    In order: a body framed two ways is refused (`framing_error`); the Host
    header must name this server (loopback, or an allowed name: a page that
    rebinds its own DNS name to 127.0.0.1 still sends that name); a browser's
    Origin must be this server's or an allowed one (other pages could
    otherwise post to a server without an API key); while draining, generation
    requests get 503; the API key when set, in exactly one Authorization
    header (two are refused as ambiguous: a proxy in front may have checked
    the other one); and POST bodies must say application/json (a form or
    text/plain post is what a page can send cross-origin without asking
    first). It also counts responses for /metrics and generation requests in
    flight for draining.
    """

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        key = state.config.api_key
        self.key = key.encode() if key else None
        self.any_host = "*" in state.config.allowed_hosts
        self.hosts = {split_host(h) for h in state.config.allowed_hosts if h != "*"}
        self.any_origin = "*" in state.config.allowed_origins
        self.origins = {o.strip().lower().rstrip("/") for o in state.config.allowed_origins if o != "*"}

    def host_allowed(self, host: str | None, server_port: int | None) -> bool:
        """Whether a Host header names this server: loopback on its own port, or an allowed name."""
        if host is None or self.any_host:  # only HTTP/1.0 clients omit Host; browsers never do
            return True
        name, port = split_host(host)
        if name in LOOPBACK_HOSTS and port in (None, server_port):
            return True
        return (name, None) in self.hosts or (name, port) in self.hosts

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        """Whether a browser page from this origin may call: an allowed origin, or this server's own."""
        origin = origin.strip().lower()
        if self.any_origin or origin in self.origins:
            return True
        return host is not None and origin in (f"http://{host.lower()}", f"https://{host.lower()}")  # same origin

    def key_error(self, raw_headers: list[tuple[bytes, bytes]]) -> ApiError | None:
        """None if the request carries the API key in one Authorization header; else the 400 or 401."""
        given = [value for name, value in raw_headers if name.lower() == b"authorization"]
        if len(given) > 1:
            return ApiError(400, f"the request has {len(given)} Authorization headers; send exactly one",
                            code="ambiguous_credentials")
        token = bearer_token(given[0]) if given else None
        if token is None or self.key is None or not hmac.compare_digest(token, self.key):
            return ApiError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                            type="authentication_error", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_headers = scope["headers"]
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in raw_headers}
        origin = headers.get("origin")
        cors = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"} if origin else {}

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.state.responses[message["status"]] += 1
                if cors:
                    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in cors.items()]
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        async def refuse(error: ApiError) -> None:
            await error_response(error)(scope, receive, counting_send)

        framing = framing_error(raw_headers)
        if framing is not None:
            return await refuse(framing)
        host = headers.get("host")
        server = scope.get("server")
        if not self.host_allowed(host, server[1] if server else None):
            return await refuse(ApiError(403, f"the Host header '{host[:100]}' is not one this server answers to "
                                         "(start it with --allow-host NAME to accept it)", code="host_not_allowed"))
        if origin is not None and not self.origin_allowed(origin, host):
            cors = {}
            return await refuse(ApiError(403, f"requests from the web origin '{origin[:100]}' are not allowed "
                                         "(start the server with --allow-origin ORIGIN to allow it)",
                                         code="origin_not_allowed"))
        path, method = scope["path"], scope["method"]
        if origin is not None and method == "OPTIONS" and "access-control-request-method" in headers:
            preflight = {**cors, "Access-Control-Allow-Methods": "GET, POST, OPTIONS", "Access-Control-Max-Age": "600",
                         "Access-Control-Allow-Headers": headers.get("access-control-request-headers",
                                                                     "authorization, content-type")}
            cors = {}
            return await Response(status_code=204, headers=preflight)(scope, receive, counting_send)
        generation = path in GENERATION_PATHS
        if generation and self.state.draining:
            return await refuse(shutting_down())
        if self.key is not None and path not in PUBLIC_PATHS:
            error = self.key_error(raw_headers)
            if error is not None:
                return await refuse(error)
        if generation and method == "POST":
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json":
                return await refuse(ApiError(415, "the request body must be sent as 'Content-Type: application/json'"
                                             f" (got '{media[:100] or 'none'}')", code="unsupported_media_type"))
        if not generation:
            return await self.app(scope, receive, counting_send)
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.state.in_flight -= 1
