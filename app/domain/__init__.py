"""The service's domain: chat turns, their admission, limits and defaults, and the errors they raise.

Plain Python over the engine and the store: nothing here imports app.api (the HTTP/WebSocket layer) or
litestar (tests/unit/test_layers.py walks the imports). The api layer decodes requests into the plain
arguments these pieces take, maps ServiceError codes to HTTP statuses and streams the events turns emit.
"""
