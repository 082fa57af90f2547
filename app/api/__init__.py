"""HTTP and WebSocket surface: sessions REST + SSE, the WebSocket protocol, the OpenAI shim, admin."""
