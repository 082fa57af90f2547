"""Markdown rendering (web/markdown.js: markdown-it + highlight.js) in Chromium: the elements it builds,
re-rendering a growing reply block by block, and pathological input that must not freeze the page.
Safety against hostile input is in test_safety.py."""

from __future__ import annotations


def test_markdown_renderer_builds_the_expected_elements(markdown):
    html = markdown.evaluate("""() => {
        // the renderer's HTML without its line breaks (none of these inputs has one inside code)
        const render = (src) => {
            const d = document.createElement('div');
            md.renderInto(d, src);
            return d.innerHTML.replaceAll('\\n', '');
        };
        return {
            heading: render('# Title'),
            inline: render('Some **bold**, *em*, ~~gone~~ and `a<b>`.'),
            snake: render('snake_case_name and 2 * 3 * 4'),
            escaped: render('\\\\*not em\\\\*'),
            lists: render('- a\\n- b\\n  - c\\n\\n1. x\\n2. y'),
            open_fence: render('```js\\nlet x = 1 < 2'),
            unknown_language: render('```klingon\\nqapla < 2\\n```'),
            table: render('| a | b |\\n|---|--:|\\n| 1 | 2 |'),
            quote: render('> quoted'),
            breaks: render('one\\ntwo'),
            autolink: render('see https://example.com/x and example.com.'),
            titled: render('[docs](https://example.com "The docs")'),
            empty_urls: render('[label]() and ![alt]()'),
        };
    }""")
    assert html["heading"] == "<h1>Title</h1>"
    assert html["inline"] == (
        "<p>Some <strong>bold</strong>, <em>em</em>, <s>gone</s> and <code>a&lt;b&gt;</code>.</p>"
    )
    assert html["snake"] == "<p>snake_case_name and 2 * 3 * 4</p>"
    assert html["escaped"] == "<p>*not em*</p>"
    assert html["lists"] == "<ul><li>a</li><li>b<ul><li>c</li></ul></li></ul><ol><li>x</li><li>y</li></ol>"
    # a fenced block: a head with the language and a Copy button, code highlighted by highlight.js
    assert html["open_fence"].startswith(
        '<div class="code-block"><div class="code-head"><span class="code-lang">js</span>'
        '<button type="button" class="code-copy"'
    )
    assert (
        '<pre tabindex="0"><code class="hljs language-js"><span class="hljs-keyword">let</span> x = '
        '<span class="hljs-number">1</span> &lt; <span class="hljs-number">2</span></code></pre></div>'
    ) in html["open_fence"]
    assert '<code class="hljs language-klingon">qapla &lt; 2</code>' in html["unknown_language"]  # plain, escaped
    # alignment is a class: no style attributes
    assert html["table"] == (
        '<div class="table-wrap" tabindex="0"><table><thead><tr><th>a</th><th class="align-right">b</th>'
        '</tr></thead><tbody><tr><td>1</td><td class="align-right">2</td></tr></tbody></table></div>'
    )
    assert html["quote"] == "<blockquote><p>quoted</p></blockquote>"
    assert html["breaks"] == "<p>one<br>two</p>"
    # bare URLs with a scheme become links; bare domains do not
    assert html["autolink"] == (
        '<p>see <a href="https://example.com/x" target="_blank" rel="noopener noreferrer nofollow">'
        'https://example.com/x</a> and example.com.</p>'
    )
    assert html["titled"] == (
        '<p><a href="https://example.com" title="The docs" target="_blank" '
        'rel="noopener noreferrer nofollow">docs</a></p>'
    )
    # an empty URL is no link; an image is never loaded (and here has nowhere to point)
    assert (
        html["empty_urls"]
        == '<p><span class="link-blocked">label</span> and <span class="link-blocked">image: alt</span></p>'
    )


def test_markdown_images_become_links_and_are_never_loaded(markdown):
    got = markdown.evaluate("""() => {
        const d = document.createElement('div');
        md.renderInto(d, '![a cat](https://example.com/cat.png)');
        return [d.querySelectorAll('img').length, d.querySelector('a').getAttribute('href'), d.textContent.trim()];
    }""")
    assert got == [0, "https://example.com/cat.png", "image: a cat"]


def test_a_growing_reply_rebuilds_only_the_blocks_that_changed(markdown):
    got = markdown.evaluate("""() => {
        const render = (el, src) => { md.renderInto(el, src); return [...el.children]; };
        const fresh = (src) => { const d = document.createElement('div'); md.renderInto(d, src); return d.innerHTML; };
        const d = document.createElement('div');
        const head = '# Plan\\n\\nFirst paragraph.\\n\\n```python\\nprint(1)\\n```\\n\\n';
        const before = render(d, head + 'Grow');
        const grown = render(d, head + 'Growing **text**');
        const growing = {
            kept: before.slice(0, 3).map((el, i) => el === grown[i]),
            replaced: before[3] !== grown[3],
            same: d.innerHTML === fresh(head + 'Growing **text**'),
        };
        const edited = render(d, head.replace('First', 'Second') + 'Growing **text**');
        const middle = {
            kept: [grown[0] === edited[0], grown[2] === edited[2], grown[3] === edited[3]],
            replaced: grown[1] !== edited[1],
            same: d.innerHTML === fresh(head.replace('First', 'Second') + 'Growing **text**'),
        };
        d.replaceChildren(document.createElement('span'));  // someone else drew in it (the typing dots)
        render(d, 'after **that**');
        const foreign = { same: d.innerHTML === fresh('after **that**') };
        render(d, '');
        return { growing, middle, foreign, emptied: d.childNodes.length };
    }""")
    assert got["growing"] == {"kept": [True, True, True], "replaced": True, "same": True}
    assert got["middle"] == {"kept": [True, True, True], "replaced": True, "same": True}
    assert got["foreign"] == {"same": True}
    assert got["emptied"] == 0


N = 100_000

# 100k-character replies: pathological ones (each a known trap for hand-written or backtracking
# parsers) and a benign one of the same length, as JS expressions.
REPLIES = {
    "benign": "fit('Here is **some** text with a [link](https://example.com) and `code`.\\n\\n- one\\n- two\\n\\n')",
    "open brackets": "fit('[')",
    "open images": "fit('![')",
    "open links": "fit('[a](')",
    "emphasis": "fit('*a **a ')",
    "underscores": "fit('_a __a ')",
    "backticks": "fit('`a ``')",
    "angle brackets": "fit('<')",
    "mixed delimiters": "fit('*_`[<')",
    "nested quotes": "Array.from({length: 700}, (_, k) => '> '.repeat(k % 150) + 'x').join('\\n').padEnd(N, 'x').slice(0, N)",  # noqa: E501
    "nested lists": "Array.from({length: 4000}, (_, k) => '  '.repeat(k % 200) + '- x').join('\\n').padEnd(N, 'x').slice(0, N)",  # noqa: E501
    "huge code block": "fit('```python\\n' + 'def f(x): return [x] * 2  # ok\\n'.repeat(40) + '```\\n')",
}


def test_pathological_replies_render_about_as_fast_as_a_benign_one(markdown):
    """Linear-time rendering: each pathological reply takes at most 10x the benign reply of the same
    length, timed in the same page (a quadratic renderer would take ~1000x)."""
    cases = ", ".join(f"{name!r}: {expr}" for name, expr in REPLIES.items())
    times = markdown.evaluate(
        """N => {
        const fit = (unit) => unit.repeat(Math.ceil(N / unit.length)).slice(0, N);
        const cases = {"""
        + cases
        + """};
        const out = {};
        for (const [name, src] of Object.entries(cases)) {
            if (src.length !== N) throw new Error(name + ' is ' + src.length + ' characters');
            let best = Infinity;
            for (let run = 0; run < 3; run++) {  // the best of three: the machine is shared
                const box = document.createElement('div');
                document.body.appendChild(box);
                const t0 = performance.now();
                md.renderInto(box, src);
                best = Math.min(best, performance.now() - t0);
                if (!box.textContent.length) throw new Error(name + ' rendered nothing');
                box.remove();
            }
            out[name] = best;
        }
        return out;
    }""",
        N,
    )
    benign = times.pop("benign")
    report = ", ".join(f"{name} {ms:.0f} ms" for name, ms in times.items())
    print(f"\n100k-character replies in Chromium: benign {benign:.0f} ms; {report}")
    slow = {name: round(ms / benign, 1) for name, ms in times.items() if ms > 10 * benign}
    assert not slow, f"render time / benign ({benign:.0f} ms): {slow}"
