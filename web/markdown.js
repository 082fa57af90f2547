// A small Markdown renderer that is safe by construction: it builds DOM nodes with
// createElement/createTextNode from a fixed set of tags and never assigns HTML strings.
// Raw HTML in the source is shown as text. Links keep only http(s)/mailto URLs.
// Supports: fenced code, headings, paragraphs (newline = <br>), lists (nested),
// blockquotes, tables, rules, **bold**, *em*, ~~strike~~, `code`, [links](url), autolinks.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*)|$)/;
const TABLE_SEP = /^ *\|? *:?-+:? *(\| *:?-+:? *)*\|? *$/;
const SAFE_SCHEMES = new Set(["http:", "https:", "mailto:"]);

/** Render Markdown source into a DocumentFragment (never parses HTML). */
export function renderMarkdown(src) {
  const frag = document.createDocumentFragment();
  const lines = String(src ?? "").replace(/\r\n?/g, "\n").split("\n");
  for (const node of parseBlocks(lines)) frag.appendChild(node);
  return frag;
}

/** Replace `el`'s children with rendered Markdown. */
export function renderInto(el, src) {
  el.replaceChildren(renderMarkdown(src));
}

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

function el(tag, className, children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (children) for (const c of children) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
  return node;
}

function isBlockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line);
}

function parseBlocks(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }

    let m = FENCE.exec(line);
    if (m) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length) {
        const t = lines[i].trim();
        if (t.startsWith(fence[0].repeat(fence.length)) && /^([`~])\1*$/.test(t) && t[0] === fence[0]) { i++; break; }
        body.push(lines[i]);
        i++;
      }
      out.push(codeBlock(body.join("\n"), m[2]));
      continue;
    }
    m = HEADING.exec(line);
    if (m) {
      out.push(el("h" + m[1].length, null, [inline(m[2] || "")]));
      i++;
      continue;
    }
    if (RULE.test(line)) { out.push(el("hr")); i++; continue; }
    if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && lines[i].trim()) {
        const q = QUOTE.exec(lines[i]);
        inner.push(q ? q[1] : lines[i]);
        i++;
      }
      out.push(el("blockquote", null, parseBlocks(inner)));
      continue;
    }
    if (LIST_ITEM.test(line)) {
      const [node, next] = parseList(lines, i);
      out.push(node);
      i = next;
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      const [node, next] = parseTable(lines, i);
      out.push(node);
      i = next;
      continue;
    }
    const para = [line];
    i++;
    while (i < lines.length && lines[i].trim() && !isBlockStart(lines[i]) && !LIST_ITEM.test(lines[i])) {
      para.push(lines[i]);
      i++;
    }
    out.push(el("p", null, [inline(para.map((l) => l.trim()).join("\n"))]));
  }
  return out;
}

function codeBlock(text, lang) {
  const language = (lang || "").toLowerCase().replace(/[^a-z0-9+#._-]/g, "").slice(0, 24);
  const code = el("code", language ? "language-" + language : null, [text]);
  const copy = el("button", "code-copy", ["Copy"]);
  copy.type = "button";
  copy.dataset.testid = "code-copy";
  copy.dataset.copy = "code";
  const head = el("div", "code-head", [el("span", "code-lang", [language || "text"]), copy]);
  return el("div", "code-block", [head, el("pre", null, [code])]);
}

function parseList(lines, start) {
  const first = LIST_ITEM.exec(lines[start]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered) {
    const n = parseInt(first[2], 10);
    if (n !== 1) list.setAttribute("start", String(n));
  }
  let i = start;
  let loose = false;
  const items = [];
  const sameList = (line) => {
    const m = line === undefined ? null : LIST_ITEM.exec(line);
    return !!m && m[1].length === indent && /\d/.test(m[2]) === ordered;
  };
  while (i < lines.length) {
    const m = LIST_ITEM.exec(lines[i]);
    if (!sameList(lines[i])) break;
    const contentIndent = indent + m[2].length + 1;
    const body = [m[3] || ""];
    i++;
    while (i < lines.length) {
      const l = lines[i];
      if (!l.trim()) {
        // a blank line continues the item only if indented content follows
        const nxt = lines[i + 1];
        if (nxt !== undefined && nxt.trim() && leading(nxt) >= contentIndent) {
          body.push("");
          loose = true;
          i++;
          continue;
        }
        if (sameList(nxt)) loose = true;
        break;
      }
      const sub = LIST_ITEM.exec(l);
      if (sub && sub[1].length <= indent) break;
      if (leading(l) < contentIndent && !sub && isBlockStart(l)) break;
      body.push(leading(l) >= contentIndent ? l.slice(contentIndent) : l.trimStart());
      i++;
    }
    items.push(body);
    while (i < lines.length && !lines[i].trim() && sameList(lines[i + 1])) i++;
  }
  for (const body of items) {
    const blocks = parseBlocks(body);
    const li = el("li");
    for (const b of blocks) {
      // tight lists: paragraphs render inline
      if (!loose && b.tagName === "P") for (const c of Array.from(b.childNodes)) li.appendChild(c);
      else li.appendChild(b);
    }
    list.appendChild(li);
  }
  return [list, i];
}

function leading(line) {
  return line.length - line.trimStart().length;
}

function splitRow(line) {
  let s = line.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  const cells = [];
  let cur = "";
  let inCode = false;
  for (let k = 0; k < s.length; k++) {
    const ch = s[k];
    if (ch === "\\" && s[k + 1] === "|") { cur += "|"; k++; continue; }
    if (ch === "`") inCode = !inCode;
    if (ch === "|" && !inCode) { cells.push(cur.trim()); cur = ""; continue; }
    cur += ch;
  }
  cells.push(cur.trim());
  return cells;
}

function parseTable(lines, start) {
  const header = splitRow(lines[start]);
  const aligns = splitRow(lines[start + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "");
  const row = (cells, tag) => {
    const tr = el("tr");
    header.forEach((_, k) => {
      const cell = el(tag, null, [inline(cells[k] ?? "")]);
      if (aligns[k]) cell.style.textAlign = aligns[k];
      tr.appendChild(cell);
    });
    return tr;
  };
  const thead = el("thead", null, [row(header, "th")]);
  const tbody = el("tbody");
  let i = start + 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes("|")) {
    tbody.appendChild(row(splitRow(lines[i]), "td"));
    i++;
  }
  return [el("div", "table-wrap", [el("table", null, [thead, tbody])]), i];
}

// ---- inline ---------------------------------------------------------------

const PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";

/** Parse inline Markdown into a DocumentFragment. */
function inline(text) {
  const frag = document.createDocumentFragment();
  let buf = "";
  const flush = () => {
    if (buf) frag.appendChild(document.createTextNode(buf));
    buf = "";
  };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === "\\" && i + 1 < text.length && PUNCT.includes(text[i + 1])) {
      buf += text[i + 1];
      i += 2;
      continue;
    }
    if (ch === "\n") {
      flush();
      frag.appendChild(el("br"));
      i++;
      continue;
    }
    if (ch === "`") {
      const run = /^`+/.exec(text.slice(i))[0];
      const close = text.indexOf(run, i + run.length);
      if (close > 0) {
        let code = text.slice(i + run.length, close).replace(/\n/g, " ");
        if (/^ .* $/.test(code)) code = code.slice(1, -1);
        flush();
        frag.appendChild(el("code", null, [code]));
        i = close + run.length;
        continue;
      }
      buf += run;
      i += run.length;
      continue;
    }
    if (ch === "!" && text[i + 1] === "[") {
      const link = parseLink(text, i + 1);
      if (link) {
        // images are never loaded: show the alt text as a link to the image
        flush();
        frag.appendChild(linkNode(link.url, "image: " + (link.label || "untitled")));
        i = link.end;
        continue;
      }
    }
    if (ch === "[") {
      const link = parseLink(text, i);
      if (link) {
        flush();
        frag.appendChild(linkNode(link.url, null, link.label));
        i = link.end;
        continue;
      }
    }
    if (ch === "<") {
      const m = /^<((?:https?:\/\/|mailto:)[^\s<>]+)>/i.exec(text.slice(i));
      if (m) {
        flush();
        frag.appendChild(linkNode(m[1], m[1]));
        i += m[0].length;
        continue;
      }
    }
    if ((ch === "h" || ch === "H") && (i === 0 || /[\s(]/.test(text[i - 1]))) {
      const m = /^https?:\/\/[^\s<>"'`]+/i.exec(text.slice(i));
      if (m) {
        const url = m[0].replace(/[.,;:!?)\]]+$/, "");
        flush();
        frag.appendChild(linkNode(url, url));
        i += url.length;
        continue;
      }
    }
    const em = emphasis(text, i);
    if (em) {
      flush();
      frag.appendChild(em.node);
      i = em.end;
      continue;
    }
    buf += ch;
    i++;
  }
  flush();
  return frag;
}

function parseLink(text, i) {
  // [label](url "title") with balanced brackets in label
  let depth = 0;
  let j = i;
  for (; j < text.length; j++) {
    if (text[j] === "\\") { j++; continue; }
    if (text[j] === "[") depth++;
    else if (text[j] === "]" && --depth === 0) break;
  }
  if (j >= text.length || text[j + 1] !== "(") return null;
  const m = /^\(\s*<?([^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)>?(?:\s+("[^"]*"|'[^']*'))?\s*\)/.exec(text.slice(j + 1));
  if (!m) return null;
  return { label: text.slice(i + 1, j), url: m[1], end: j + 1 + m[0].length };
}

function linkNode(rawUrl, text, label) {
  const url = safeUrl(rawUrl);
  const content = label !== undefined ? inline(label) : document.createTextNode(text);
  if (!url) {
    // an unsafe URL: keep the visible label, drop the link
    return el("span", "link-blocked", [content]);
  }
  const a = el("a", null, [content]);
  a.href = url;
  a.target = "_blank";
  a.rel = "noopener noreferrer nofollow";
  return a;
}

function emphasis(text, i) {
  for (const [delim, tag] of [["**", "strong"], ["__", "strong"], ["~~", "del"], ["*", "em"], ["_", "em"]]) {
    if (!text.startsWith(delim, i)) continue;
    const after = text[i + delim.length];
    if (!after || /\s/.test(after)) continue;
    if (delim[0] === "_" && i > 0 && /[\p{L}\p{N}]/u.test(text[i - 1])) continue;
    let j = i + delim.length;
    while ((j = text.indexOf(delim, j + 1)) !== -1) {
      if (/\s/.test(text[j - 1])) continue;
      if (delim.length === 1 && text[j + 1] === delim) { j++; continue; }
      if (delim[0] === "_" && /[\p{L}\p{N}]/u.test(text[j + delim.length] || "")) continue;
      break;
    }
    if (j === -1) continue;
    const inner = text.slice(i + delim.length, j);
    return { node: el(tag, null, [inline(inner)]), end: j + delim.length };
  }
  return null;
}
