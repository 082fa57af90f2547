"""Nothing a message contains can become markup or script in the page: user input, model output
and imported sessions all render as text; links keep only http(s)/mailto URLs."""
from __future__ import annotations

import pytest

PAYLOAD = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'

# Every element the renderer may create, and the attributes it may set.
ALLOWED = """{
  tags: new Set(['P','H1','H2','H3','H4','H5','H6','UL','OL','LI','BLOCKQUOTE','HR','PRE','CODE','DIV','SPAN',
                 'BUTTON','STRONG','EM','DEL','A','BR','TABLE','THEAD','TBODY','TR','TH','TD']),
  attrs: new Set(['class','href','target','rel','start','style','type','data-testid','data-copy']),
}"""

# Elements/attributes that must never appear inside rendered message content.
DANGEROUS = ("script, img, iframe, svg, object, embed, style, link, meta, form, input, video, audio, "
             "[onerror], [onload], [onclick], [onmouseover], [onbegin], [srcdoc]")

MALICIOUS_REPLY = "\n\n".join([
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
])


def _injected(page) -> list[str]:
    return page.eval_on_selector_all(f'[data-testid="message-content"] :is({DANGEROUS})',
                                     "els => els.map(e => e.outerHTML)")


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
        "session": {"title": '<img src=x onerror="window.__pwned=20">Imported',
                    "system_prompt": None, "settings": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 16}},
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
    for literal in ("<script>window.__pwned = 3</script>", '<img src=x onerror="window.__pwned=4">',
                    '<iframe src="javascript:window.__pwned=5"></iframe>', '<a href="javascript:window.__pwned=9">',
                    '<b onmouseover="window.__pwned=11">x</b>', '<svg onload="window.__pwned=13">'):
        assert literal in text, literal
    # only the https link survives as a link; unsafe ones keep their label as plain text
    links = reply.locator("a").evaluate_all("as => as.map(a => [a.getAttribute('href'), a.rel, a.target])")
    assert links == [["https://example.com/docs", "noopener noreferrer nofollow", "_blank"]]
    assert "[tabbed](java\tscript:window.__pwned=7)" in text  # whitespace in a URL: not a link at all
    for label in ("click me", "data url", "picture"):
        blocked = reply.locator(".link-blocked", has_text=label)
        assert blocked.count() == 1, label
        blocked.click()
    assert page.url.endswith(f"/#/s/{sid}")
    # markdown still works around the payloads
    assert reply.locator("strong").count() == 1
    assert reply.locator(".code-block code.language-html").text_content() == "<script>window.__pwned=12</script>"
    assert chat.messages().first.get_by_test_id("message-content").text_content() == export["messages"][0]["content"]
    assert page.get_by_test_id("session-title").text_content() == export["session"]["title"]
    _settle(page)
    assert page.evaluate("window.__pwned") is None


@pytest.fixture()
def markdown(page, server):
    """The page's Markdown module, loaded in a blank page of the server's origin."""
    page.goto("/static/markdown.js")  # same origin, no app running
    page.evaluate("async () => { window.md = await import('/static/markdown.js'); }")
    return page


def test_markdown_renderer_builds_the_expected_elements(markdown):
    html = markdown.evaluate("""() => {
        const render = (src) => { const d = document.createElement('div'); md.renderInto(d, src); return d.innerHTML; };
        return {
            heading: render('# Title'),
            inline: render('Some **bold**, *em*, ~~gone~~ and `a<b>`.'),
            snake: render('snake_case_name and 2 * 3 * 4'),
            escaped: render('\\\\*not em\\\\*'),
            lists: render('- a\\n- b\\n  - c\\n\\n1. x\\n2. y'),
            open_fence: render('```js\\nlet x = 1 < 2'),
            table: render('| a | b |\\n|---|--:|\\n| 1 | 2 |'),
            quote: render('> quoted'),
            breaks: render('one\\ntwo'),
            autolink: render('see https://example.com/x.'),
        };
    }""")
    assert html["heading"] == "<h1>Title</h1>"
    assert html["inline"] == ("<p>Some <strong>bold</strong>, <em>em</em>, <del>gone</del> and "
                              "<code>a&lt;b&gt;</code>.</p>")
    assert html["snake"] == "<p>snake_case_name and 2 * 3 * 4</p>"
    assert html["escaped"] == "<p>*not em*</p>"
    assert html["lists"] == "<ul><li>a</li><li>b<ul><li>c</li></ul></li></ul><ol><li>x</li><li>y</li></ol>"
    assert '<code class="language-js">let x = 1 &lt; 2</code>' in html["open_fence"]
    assert html["table"].startswith('<div class="table-wrap"><table><thead><tr><th>a</th><th style="text-align: right;">b</th>')
    assert html["quote"] == "<blockquote><p>quoted</p></blockquote>"
    assert html["breaks"] == "<p>one<br>two</p>"
    assert '<a href="https://example.com/x" target="_blank" rel="noopener noreferrer nofollow">' in html["autolink"]
    assert html["autolink"].endswith("</a>.</p>")


def test_markdown_safe_url_keeps_only_http_and_mailto(markdown):
    urls = ["https://example.com/a?b=c", "http://x.y", "mailto:me@example.com", "javascript:alert(1)",
            "JaVaScRiPt:alert(1)", " javascript:alert(1)", "java\tscript:alert(1)", "java\nscript:alert(1)",
            "\u0001javascript:alert(1)", "data:text/html,hi", "vbscript:msgbox", "//evil.example/x", "/api/sessions",
            "#top", "file:///etc/passwd"]
    got = markdown.evaluate("urls => urls.map(u => md.safeUrl(u))", urls)
    assert got[:3] == ["https://example.com/a?b=c", "http://x.y/", "mailto:me@example.com"]
    assert got[3:] == [None] * (len(urls) - 3)


def test_markdown_renderer_never_creates_unlisted_elements_or_attributes(markdown):
    """Render thousands of random mixes of Markdown and HTML fragments; only allowed markup may appear."""
    bad = markdown.evaluate("""() => {
        const allowed = """ + ALLOWED + """;
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
    }""")
    assert bad == []
