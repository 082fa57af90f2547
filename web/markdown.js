// Markdown for chat messages: markdown-it with raw HTML off, code highlighted by highlight.js.
// Links keep only absolute http(s)/mailto URLs; images are never loaded (shown as links).
// renderInto patches the target per top-level block, so a growing reply only rebuilds the
// blocks whose HTML changed since the last render.
import MarkdownIt from "./vendor/markdown-it.min.js";
import hljs from "./vendor/highlight.min.js";

const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);
const LINK_REL = "noopener noreferrer nofollow";
const HIGHLIGHT_CACHE_SIZE = 64;

const md = new MarkdownIt({ html: false, linkify: true, breaks: true });
md.linkify.set({ fuzzyLink: false, fuzzyEmail: false, fuzzyIP: false }); // only URLs with a scheme
md.validateLink = (url) => safeUrl(url) !== null;
md.core.ruler.push("forge_links", linkTargets);
md.core.ruler.push("forge_align", alignClasses);
md.renderer.rules.fence = (tokens, i) => codeBlock(tokens[i].content, tokens[i].info);
md.renderer.rules.code_block = (tokens, i) => codeBlock(tokens[i].content, "");
md.renderer.rules.table_open = () => '<div class="table-wrap" tabindex="0"><table>\n';
md.renderer.rules.table_close = () => "</table></div>\n";

const escape = md.utils.escapeHtml;
const rendered = new WeakMap(); // element -> {html: [string], nodes: [[Node]]} of its last render

/** Keep a URL only when it is absolute http(s) or mailto; return null otherwise. */
export function safeUrl(raw) {
  // Browsers ignore ASCII tab/newline and leading controls/spaces inside URLs
  // ("java\tscript:"), so strip them before looking at the scheme.
  const cleaned = String(raw).replace(/[\u0000-\u0020\u007f-\u009f]/g, "");
  const m = /^([a-z][a-z0-9+.-]*):/i.exec(cleaned);
  if (!m || !SAFE_SCHEMES.has(m[1].toLowerCase() + ":")) return null;
  try {
    const url = new URL(cleaned);
    return SAFE_SCHEMES.has(url.protocol) ? url.href : null;
  } catch {
    return null;
  }
}

/** Render Markdown source into `el`, rebuilding only the top-level blocks that changed. */
export function renderInto(el, src) {
  const env = {};
  const html = topLevelBlocks(md.parse(String(src ?? ""), env)).map((b) => md.renderer.render(b, md.options, env));
  const prev = rendered.get(el);
  const nodes = html.map((h, k) => {
    const old = prev && prev.html[k] === h ? prev.nodes[k] : null;
    return old && old.every((n) => n.parentNode === el) ? old : parse(h);
  });
  const keep = new Set(nodes.flat());
  for (const n of Array.from(el.childNodes)) if (!keep.has(n)) n.remove();
  let cursor = el.firstChild;
  for (const n of keep) {
    if (n === cursor) cursor = cursor.nextSibling;
    else el.insertBefore(n, cursor);
  }
  rendered.set(el, { html, nodes });
}

function parse(html) {
  const tpl = document.createElement("template");
  tpl.innerHTML = html;
  return Array.from(tpl.content.childNodes);
}

/** Split a token stream where each top-level block (paragraph, list, fence, ...) ends. */
function topLevelBlocks(tokens) {
  const blocks = [];
  let start = 0;
  tokens.forEach((t, i) => {
    if (t.level === 0 && t.nesting <= 0) {
      blocks.push(tokens.slice(start, i + 1));
      start = i + 1;
    }
  });
  return blocks;
}

/** Core rule: links open in a new tab; a link whose URL was refused (empty href) becomes a
 *  plain span that keeps its label; images become links to the image (never loaded). */
function linkTargets(state) {
  for (const block of state.tokens) {
    if (block.type !== "inline" || !block.children) continue;
    const out = [];
    for (const t of block.children) {
      if (t.type !== "image") { out.push(t); continue; }
      const open = new state.Token("link_open", "a", 1);
      open.attrs = [["href", t.attrGet("src") || ""]];
      const text = new state.Token("text", "", 0);
      text.content = "image: " + (t.content || "untitled");
      out.push(open, text, new state.Token("link_close", "a", -1));
    }
    let blocked = false; // links never nest: each link_close belongs to the last link_open
    for (const t of out) {
      if (t.type === "link_open") {
        blocked = !t.attrGet("href");
        if (blocked) {
          t.tag = "span";
          t.attrs = [["class", "link-blocked"]];
        } else {
          t.attrSet("target", "_blank");
          t.attrSet("rel", LINK_REL);
        }
      } else if (t.type === "link_close" && blocked) {
        t.tag = "span";
      }
    }
    block.children = out;
  }
}

/** Core rule: table cell alignment as classes, not style attributes (the CSP need not allow them). */
function alignClasses(state) {
  for (const t of state.tokens) {
    if (t.type !== "th_open" && t.type !== "td_open") continue;
    const m = /text-align:(\w+)/.exec(t.attrGet("style") || "");
    if (!m) continue;
    t.attrs = t.attrs.filter(([name]) => name !== "style");
    t.attrSet("class", "align-" + m[1]);
  }
}

function codeBlock(content, info) {
  const lang = (info || "").trim().split(/\s+/)[0].toLowerCase().replace(/[^a-z0-9+#._-]/g, "").slice(0, 24);
  const text = content.endsWith("\n") ? content.slice(0, -1) : content;
  const cls = "hljs" + (lang ? " language-" + lang : "");
  return '<div class="code-block"><div class="code-head">' +
    `<span class="code-lang">${escape(lang || "text")}</span>` +
    '<button type="button" class="code-copy" data-testid="code-copy" data-copy="code">Copy</button></div>' +
    `<pre tabindex="0"><code class="${cls}">${highlight(text, lang)}</code></pre></div>\n`;
}

const highlighted = new Map(); // "lang\0text" -> HTML; a streaming reply re-renders its earlier blocks

function highlight(text, lang) {
  if (!lang || !hljs.getLanguage(lang)) return escape(text);
  const key = lang + "\0" + text;
  let html = highlighted.get(key);
  if (html === undefined) {
    html = hljs.highlight(text, { language: lang, ignoreIllegals: true }).value;
    if (highlighted.size >= HIGHLIGHT_CACHE_SIZE) highlighted.delete(highlighted.keys().next().value);
  } else {
    highlighted.delete(key); // refresh its place in the eviction order
  }
  highlighted.set(key, html);
  return html;
}
