"""Nothing a message contains can become markup or script in the page: user input, model output
and imported sessions all render as text; links keep only http(s)/mailto URLs."""

from __future__ import annotations

PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'

# Every element the renderer may create, and the attributes it may set (no style attributes: the
# CSP need not allow them).
ALLOWED = """{
  tags: new Set(['P','H1','H2','H3','H4','H5','H6','UL','OL','LI','BLOCKQUOTE','HR','PRE','CODE','DIV','SPAN',
                 'BUTTON','STRONG','EM','S','A','BR','TABLE','THEAD','TBODY','TR','TH','TD']),
  attrs: new Set(['class','href','title','target','rel','start','type','tabindex','data-testid','data-copy']),
}"""

# Elements/attributes that must never appear inside rendered message content.
DANGEROUS = (
    "script, img, iframe, svg, object, embed, style, link, meta, form, input, video, audio, "
    "[onerror], [onload], [onclick], [onmouseover], [onbegin], [srcdoc]"
)

MALICIOUS_REPLY = "\n\n".join(
    [
        "Hello <script>window.__pwned = 3</script> world",
        '<img src=x onerror="window.__pwned=4">',
        '<iframe src="javascript:window.__pwned=5"></iframe>',
        "[click me](javascript:window.__pwned=6)",
        "[tabbed](java\tscript:window.__pwned=7)",
        "[data url](data:text/html,window.__pwned=8)",
        '<a href="javascript:window.__pwned=9">raw link</a>',
        "![picture](javascript:window.__pwned=10)",
        '**bold <b onmouseover="window.__pwned=11">x</b>**',
        "```html\n<script>window.__pwned=12</script>\n```",
        '`<svg onload="window.__pwned=13">`',
        "<javascript:window.__pwned=14>",
        "[fine](https://example.com/docs)",
        '<svg><animate onbegin="window.__pwned=15" attributeName="x" dur="1s"/></svg>',
    ]
)


def _injected(page) -> list[str]:
    return page.eval_on_selector_all(
        f'[data-testid="message-content"] :is({DANGEROUS})', "els => els.map(e => e.outerHTML)"
    )


def _settle(page) -> None:
    """Give any (wrongly) inserted handler a chance to run: two animation frames and a macrotask."""
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 50))))")


def test_user_message_with_html_renders_literally(chat, server, screenshot):
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=8, temperature=0)
    chat.send(PAYLOAD)
    reply = chat.assistant()
    reply.wait_for()
    chat.wait_finished(reply)
    _settle(page)

    user = chat.messages().first
    assert user.get_by_test_id("message-content").text_content() == PAYLOAD
    assert _injected(page) == []
    assert page.evaluate("window.__pwned") is None
    # the server titles the session from this message: title and sidebar show it as text too
    title = server.session(sid)["title"]
    assert "<script>" in title
    assert page.get_by_test_id("session-title").text_content() == title
    item = page.locator(f'[data-testid="session-item"][data-id="{sid}"]')
    assert item.get_by_test_id("session-name").text_content() == title
    assert page.locator("body script").count() == 0
    # defence in depth: the page allows only its own scripts (a response header, not a <meta>)
    csp = server.http.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "object-src 'none'" in csp
    screenshot(page, "safety-user-html")


def test_imported_reply_with_html_and_script_links_is_inert(chat, server, page, screenshot):
    export = {
        "forge_export": 1,
        "session": {
            "title": '<img src=x onerror="window.__pwned=20">Imported',
            "system_prompt": None,
            "settings": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 16},
        },
        "messages": [
            {"role": "system", "content": "<script>window.__pwned=21</script>", "status": "complete"},
            {"role": "user", "content": "Show me <b>HTML</b>", "status": "complete"},
            {"role": "assistant", "content": MALICIOUS_REPLY, "status": "complete", "finish_reason": "stop"},
        ],
    }
    r = server.http.post("/api/sessions/import", json=export)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]

    chat.open(f"/#/s/{sid}")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=message]').length === 3")
    _settle(page)
    screenshot(page, "safety-imported")

    assert _injected(page) == []
    assert page.evaluate("window.__pwned") is None
    reply = chat.assistant().get_by_test_id("message-content")
    text = reply.text_content()
    for literal in (
        "<script>window.__pwned = 3</script>",
        '<img src=x onerror="window.__pwned=4">',
        '<iframe src="javascript:window.__pwned=5"></iframe>',
        '<a href="javascript:window.__pwned=9">',
        '<b onmouseover="window.__pwned=11">x</b>',
        '<svg onload="window.__pwned=13">',
    ):
        assert literal in text, literal
    # only the https link survives as a link; links to other schemes stay their Markdown source, as text
    links = reply.locator("a").evaluate_all("as => as.map(a => [a.getAttribute('href'), a.rel, a.target])")
    assert links == [["https://example.com/docs", "noopener noreferrer nofollow", "_blank"]]
    for source in (
        "[click me](javascript:window.__pwned=6)",
        "[tabbed](java\tscript:window.__pwned=7)",
        "[data url](data:text/html,window.__pwned=8)",
        "![picture](javascript:window.__pwned=10)",
        "<javascript:window.__pwned=14>",
    ):
        assert source in text, source
    reply.get_by_text("[click me](javascript:window.__pwned=6)").click()
    assert page.url.endswith(f"/#/s/{sid}")
    # markdown still works around the payloads
    assert reply.locator("strong").count() == 1
    assert reply.locator(".code-block code.language-html").text_content() == "<script>window.__pwned=12</script>"
    assert chat.messages().first.get_by_test_id("message-content").text_content() == export["messages"][0]["content"]
    assert page.get_by_test_id("session-title").text_content() == export["session"]["title"]
    _settle(page)
    assert page.evaluate("window.__pwned") is None


def test_markdown_safe_url_keeps_only_http_and_mailto(markdown):
    urls = [
        "https://example.com/a?b=c",
        "http://x.y",
        "mailto:me@example.com",
        "javascript:alert(1)",
        "JaVaScRiPt:alert(1)",
        " javascript:alert(1)",
        "java\tscript:alert(1)",
        "java\nscript:alert(1)",
        "\u0001javascript:alert(1)",
        "data:text/html,hi",
        "vbscript:msgbox",
        "//evil.example/x",
        "/api/sessions",
        "#top",
        "file:///etc/passwd",
    ]
    got = markdown.evaluate("urls => urls.map(u => md.safeUrl(u))", urls)
    assert got[:3] == ["https://example.com/a?b=c", "http://x.y/", "mailto:me@example.com"]
    assert got[3:] == [None] * (len(urls) - 3)


def test_markdown_renderer_never_creates_unlisted_elements_or_attributes(markdown):
    """Render thousands of random mixes of Markdown and HTML fragments; only allowed markup may appear."""
    bad = markdown.evaluate(
        """() => {
        const allowed = """
        + ALLOWED
        + """;
        const parts = ['<script>alert(1)</script>', '<img src=x onerror=alert(1)>', '**', '*', '_', '`', '```', '\\n',
            '\\n\\n', '[a](javascript:alert(1))', '[b](https://ok.example)', '](', ')', '<', '>', '"', "'", '&lt;',
            '# ', '- ', '1. ', '> ', '|', '---', '~~', '\\\\', '<a href="javascript:x">', '<svg onload=alert(1)>',
            'text ', 'javascript:', 'https://example.com', '<iframe srcdoc="x">', '![i](x)', '    ', '\\t'];
        let seed = 12345;
        const rand = (n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
        const problems = [];
        for (let i = 0; i < 3000 && problems.length < 5; i++) {
            let src = '';
            for (let k = rand(20) + 1; k > 0; k--) src += parts[rand(parts.length)];
            const box = document.createElement('div');
            md.renderInto(box, src);
            for (const el of box.querySelectorAll('*')) {
                if (!allowed.tags.has(el.tagName)) problems.push([src, el.tagName]);
                for (const a of el.attributes) {
                    if (!allowed.attrs.has(a.name)) problems.push([src, el.tagName + '@' + a.name]);
                    if (a.name === 'href' && !/^(https?:|mailto:)/.test(a.value)) problems.push([src, a.value]);
                }
            }
        }
        return problems;
    }"""
    )
    assert bad == []


# Markdown constructs whose attributes carry the payload: a fence's language, a link's title, an
# image's alt text, encoded schemes, reference definitions, highlighted HTML.
HOSTILE_MARKDOWN = [
    '```"><img src=x onerror="window.__pwned=30">\ncode\n```',
    '```html\n<img src=x onerror="window.__pwned=31"><script>window.__pwned=32</script>\n```',
    '[title](https://example.com "\\" onmouseover=\\"window.__pwned=33")',
    '![alt" onerror="window.__pwned=34](https://example.com/x.png)',
    "[entity](&#106;avascript:window.__pwned=35)",
    "[colon](javascript&colon;window.__pwned=36)",
    "[percent](%6Aavascript:window.__pwned=37)",
    "[ref]\n\n[ref]: javascript:window.__pwned=38",
    "<https://example.com/\"onmouseover=\"window.__pwned=39>",
    "https://example.com/\"><img src=x onerror=window.__pwned=40>",
    '| a |\n|:-:|\n| <img src=x onerror="window.__pwned=41"> |',
    "[vb](vbscript:msgbox) [file](file:///etc/passwd) [rel](/api/sessions) [frag](#top)",
]


def test_hostile_markdown_renders_inert(markdown):
    got = markdown.evaluate(
        """([sources, dangerous]) => {
        const box = document.createElement('div');
        document.body.appendChild(box);
        md.renderInto(box, sources.join('\\n\\n'));
        const attrs = [...box.querySelectorAll('*')].flatMap(el => [...el.attributes].map(a => [a.name, a.value]));
        return {
            injected: [...box.querySelectorAll(dangerous)].map(e => e.outerHTML),
            handlers: attrs.filter(([name]) => name.startsWith('on')),
            hrefs: [...box.querySelectorAll('a')].map(a => a.getAttribute('href')),
            text: box.textContent,
        };
    }""",
        [HOSTILE_MARKDOWN, DANGEROUS],
    )
    _settle(markdown)
    assert markdown.evaluate("window.__pwned") is None
    assert got["injected"] == [] and got["handlers"] == []
    assert all(h.startswith("https://") for h in got["hrefs"]), got["hrefs"]
    # the payloads are there to read, as text
    for literal in (
        '<img src=x onerror="window.__pwned=31">',
        "<script>window.__pwned=32</script>",
        "[entity](javascript:window.__pwned=35)",  # the entity decoded, as text
        "[ref]",
        '<img src=x onerror="window.__pwned=41">',
        "[vb](vbscript:msgbox)",
    ):
        assert literal in got["text"], literal
