"""The API reference at /schema: RapiDoc from web/vendor renders every route in Chromium under the page's
CSP, and the page fetches nothing from anywhere but the server (the machines here reach no CDN)."""

from __future__ import annotations

from urllib.parse import urlsplit

from conftest import shot


def test_the_api_reference_renders_offline_from_vendored_files(server, page):
    origin = urlsplit(server.base_url).netloc
    elsewhere: list[str] = []
    page.on("request", lambda r: urlsplit(r.url).netloc not in (origin, "") and elsewhere.append(r.url))
    refused: list[str] = []
    page.on("console", lambda m: "Content Security Policy" in m.text and refused.append(m.text))

    response = page.goto(f"{server.base_url}/schema")
    assert response.status == 200
    # RapiDoc draws into its shadow root once it has fetched and parsed /schema/openapi.json.
    page.wait_for_function(
        """() => {
        const doc = document.querySelector('rapi-doc');
        return doc && doc.shadowRoot && doc.shadowRoot.textContent.includes('/v1/chat/completions');
    }""",
        timeout=30_000,
    )
    text = page.evaluate("document.querySelector('rapi-doc').shadowRoot.textContent")
    assert "/api/sessions/{session_id}/messages" in text and "/v1/completions" in text
    assert elsewhere == [] and refused == []
    shot(page, "api-reference")
