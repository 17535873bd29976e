// agentik web chat: the page's code (index.html is its markup and style).  Loaded with
// ``defer`` by its version (/static/app.js?v=…, kept for good by the browser), so the
// page's markup paints before this is compiled; the API prefix comes from
// <html data-api>, the version of the static files from <html data-v>, both filled in
// by the server.  docs/web.md describes the page.
"use strict";
const API = document.documentElement.dataset.api;
const $ = (id) => document.getElementById(id);
const state = {
  token: localStorage.getItem("agentik.token") || "",
  current: null,      // the open conversation
  title: "",
  stream: null,       // AbortController of its event stream
  running: null,      // run id of the turn being written
  bubble: null,       // the assistant message being written
  segment: null,      // its text part being written (tool cards split the text)
  // Events are shown in order with the history: a connection's events wait
  // until the history read after it is shown (ready), and the events of turns
  // the history already shows whole (done) are not shown again.
  ready: Promise.resolve(),
  // Opening a conversation takes a few round trips, and its messages show before
  // the box is usable: a shortcut pressed meanwhile waits for this, not ignored.
  opening: Promise.resolve(),
  done: new Set(),
  assistant: "assistant",  // the configured agent name ([agent] name), from /status
  lastUser: "",       // the last message sent here (regenerate, edit last)
  older: null,        // where the oldest page of history shown ends (null: it is the first)
  branchedFrom: new Set(),  // the questions a later one replaced (regenerate, edit)
  editing: false,     // the box holds the last question, to replace it
};

class Unauthorized extends Error {}

// A conversation's path: ids may be any text (a snapshot's, kept on import),
// so each one is one encoded path segment, never raw URL syntax.
const conversationPath = (id) => "/conversations/" + encodeURIComponent(id);
// A static file (a vendored library) by the version of this server's files: kept for
// good by the browser, so a reload asks the server for nothing.
const staticFile = (path) => "/static/" + path + "?v=" + document.documentElement.dataset.v;

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.token) h["Authorization"] = "Bearer " + state.token;
  return h;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(API + path, init);
  if (r.status === 401) { askToken(); throw new Unauthorized(); }
  if (r.status === 204) return null;
  const data = await r.json();
  if (!r.ok) throw new Error(data.error ? data.error.message : r.statusText);
  return data;
}

// The token dialog; says so when the token kept or typed was refused.
function askToken() {
  $("auth-error").textContent = state.token ? "That token was not accepted (wrong or expired)." : "";
  $("auth").classList.add("open");
  $("token").focus();
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function when(ts) {
  const d = new Date(ts * 1000);
  return d.toDateString() === new Date().toDateString()
    ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : d.toLocaleDateString();
}

// -- Markdown ----------------------------------------------------------------------
// Model output is Markdown (CommonMark + GFM tables and fences).  Raw HTML in it is
// shown as typed, never as markup; DOMPurify then cleans what marked made (links
// with javascript: and the like dropped), and links open in a new tab without a
// referrer.  Images become links: a model's image would be fetched from anywhere.
let markdown = null;
function markdownParser() {
  if (markdown || !window.marked || !window.DOMPurify) return markdown;
  const escape = (s) => s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  markdown = new marked.Marked({ gfm: true });
  markdown.use({ extensions: MATH.map((m) => ({
    name: m.name, level: m.level,
    start: (src) => { const i = src.search(m.start); return i < 0 ? undefined : i; },
    tokenizer(src) {
      const found = m.re.exec(src);
      if (found) return { type: m.name, raw: found[0], tex: found[1] || found[2] || found[3] };
    },
    renderer: (token) => (m.level === "block" ? '<div class="math display">' : '<span class="math">')
      + escape(token.tex.trim()) + (m.level === "block" ? "</div>" : "</span>"),
  })) });
  markdown.use({ renderer: {
    html: (token) => escape(token.text),
    image: (token) => '<a href="' + escape(token.href || "") + '">' + escape(token.text || token.href || "image") + "</a>",
  } });
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      if (!node.getAttribute("href")) { node.removeAttribute("href"); return; }
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  return markdown;
}
// Math, in the delimiters of LaTeX: $$…$$ and \[…\] on lines of their own are shown
// as a display, \(…\) (and $$…$$ or \[…\] inside a sentence) in the line.  A single
// $…$ is not math here: "$5 or $10" is about prices far more often than about TeX.
// marked keeps the TeX as text (its backslashes and underscores untouched), KaTeX
// typesets it: loaded with the first message that holds math, never with the page.
const MATH = [
  { name: "mathBlock", level: "block", start: /^ {0,3}(\$\$|\\\[)/m,
    re: /^ {0,3}(?:\$\$([\s\S]+?)\$\$|\\\[([\s\S]+?)\\\])[ \t]*(?:\n+|$)/ },
  { name: "mathInline", level: "inline", start: /\$\$|\\[([]/,
    re: /^(?:\$\$((?:\\[\s\S]|[^\\$])+?)\$\$|\\\(([\s\S]+?)\\\)|\\\[([\s\S]+?)\\\])/ },
];
const PURIFY = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["style", "img", "form", "input", "button", "textarea", "select", "video", "audio", "source"],
  FORBID_ATTR: ["style", "id", "name"],
};

// Shows ``src`` (Markdown) in ``box``; ``writing``: more is coming, keep the
// trailing blanks the next piece follows on.
function renderInto(box, src, writing) {
  const md = markdownParser();
  if (!md) { box.source = src; box.textContent = src; box.classList.add("pending"); return; }
  box.classList.remove("pending");
  box.innerHTML = DOMPurify.sanitize(md.parse(src), PURIFY).trim();
  const tail = writing ? src.match(/\s*$/)[0] : "";
  if (tail && !/\s$/.test(box.textContent)) box.append(tail);
  for (const pre of box.querySelectorAll("pre")) {
    const wrap = el("div", "code");
    pre.replaceWith(wrap);
    const copy = el("button", "copy", "Copy");
    copy.type = "button";
    copy.setAttribute("aria-label", "Copy code");
    wrap.append(pre, copy);
    if (!writing) highlight(pre);
  }
  if (box.querySelector(".math")) typeset(box);
}

// KaTeX (script, stylesheet, fonts: static/vendor/katex/) is loaded with the first
// message that holds math; what was shown before it arrived is typeset then.  Its
// markup is built as DOM nodes (its inline styles set through the DOM, which the
// page's Content-Security-Policy allows) and sanitized in place like the rest; the
// model's TeX cannot ask for links, styles or HTML (KaTeX's trust is off).
const MATH_PURIFY = Object.assign({}, PURIFY, {
  USE_PROFILES: { html: true, mathMl: true }, FORBID_ATTR: ["id", "name"], IN_PLACE: true,
});
let katexLoading = false;
function typeset(box) {
  if (!window.katex) {
    if (!katexLoading) {
      katexLoading = true;
      const css = el("link");
      css.rel = "stylesheet";
      css.href = staticFile("vendor/katex/katex.min.css");
      const script = el("script");
      script.src = staticFile("vendor/katex/katex.min.js");
      script.onload = () => { for (const m of document.querySelectorAll("#messages .text")) typeset(m); };
      document.head.append(css, script);
    }
    return;
  }
  for (const m of box.querySelectorAll(".math:not(.typeset)")) {
    const tex = m.textContent;
    katex.render(tex, m, { displayMode: m.classList.contains("display"), throwOnError: false });
    DOMPurify.sanitize(m, MATH_PURIFY);
    m.classList.add("typeset");
    m.setAttribute("data-tex", tex);
  }
}

// highlight.js (and its languages) is loaded with the first code block that names
// a language, not with the page; blocks shown before it arrives are highlighted then.
let highlighter = null;
function highlight(pre) {
  const code = pre.querySelector("code");
  const lang = code && (code.className.match(/language-([\w+#-]+)/) || [])[1];
  if (!lang || code.dataset.highlighted) return;
  if (!window.hljs) {
    if (!highlighter) {
      highlighter = el("script");
      highlighter.type = "module";
      highlighter.src = staticFile("highlight.js");
      document.head.append(highlighter);
    }
    return;
  }
  if (hljs.getLanguage(lang)) hljs.highlightElement(code);
}
window.addEventListener("agentik:highlight", () => {
  for (const pre of document.querySelectorAll("#messages .text:not(.pending) pre"))
    soon(() => { if (!(state.segment && state.segment.contains(pre))) highlight(pre); });
});

// Work that may wait (the history's Markdown, highlighting) runs in slices of a few
// milliseconds, the latest asked for first (the bottom of the chat, what was just
// scrolled to): no task holds up typing, scrolling or a streaming answer.
const later = [];
let slicing = 0;
function soon(job) {
  later.push(job);
  if (!slicing) slicing = setTimeout(runSlice, 0);
}
function runSlice() {
  const until = performance.now() + 8;
  while (later.length && performance.now() < until) later.pop()();
  slicing = later.length ? setTimeout(runSlice, 0) : 0;
}

// The history's answers are shown as plain text first and as Markdown once they come
// near the viewport: opening a long conversation costs what is on the screen.
const pending = new IntersectionObserver((entries) => {
  if (!markdownParser()) return;  // marked and DOMPurify are not there yet: see below
  for (const e of entries) {
    if (!e.isIntersecting) continue;
    pending.unobserve(e.target);
    soon(() => {
      for (const part of e.target.querySelectorAll(".text.pending")) renderInto(part, part.source, false);
    });
  }
}, { root: document.getElementById("messages"), rootMargin: "400px 0px" });
// marked and DOMPurify are loaded once the page's first paint is on the screen (the
// first paint does not wait for them); what was shown as plain text meanwhile is shown
// again.  Not as soon as the first frame is drawn: their compiling then competed with
// putting that frame on the screen.  Not later, when idle: a conversation opened at
// once would then share its first frames with them, measured slower.
function loadLibraries() {
  let left = 2;
  for (const name of ["marked.umd.js", "purify.min.js"]) {
    const script = el("script");
    script.src = staticFile("vendor/" + name);
    script.onload = () => { if (--left === 0) librariesReady(); };
    document.head.append(script);
  }
}
function librariesReady() {
  for (const part of document.querySelectorAll("#messages .text.pending")) {
    if (part.source === undefined) continue;
    const bubble = part.closest(".msg");
    pending.unobserve(bubble);
    pending.observe(bubble);
  }
  for (const part of dirty) scheduleRender(part);
}
// ``run`` once the first contentful paint is reported (Paint Timing); at once in a page
// that is hidden (it paints nothing until shown) or a browser that reports no paint,
// and after a second at the latest.
function afterFirstPaint(run) {
  let done = false;
  const go = () => { if (!done) { done = true; run(); } };
  if (document.visibilityState !== "visible"
      || !(PerformanceObserver.supportedEntryTypes || []).includes("paint")) return go();
  new PerformanceObserver((list, observer) => {
    if (list.getEntriesByName("first-contentful-paint").length) { observer.disconnect(); go(); }
  }).observe({ type: "paint", buffered: true });
  setTimeout(go, 1000);
}
afterFirstPaint(loadLibraries);
function renderLater(bubble, part, src) {
  part.source = src;
  part.textContent = src;
  part.classList.add("pending");
  pending.observe(bubble);
}

async function copyText(text, button) {
  try { await navigator.clipboard.writeText(text); }
  catch (e) {
    const area = el("textarea"); area.value = text; document.body.append(area); area.select();
    document.execCommand("copy"); area.remove();
  }
  if (button) { button.textContent = "Copied"; setTimeout(() => { button.textContent = "Copy"; }, 1500); }
  announce("Copied");
}

// While an answer streams, its current text part is shown again at most once a
// frame (never the messages before it).
const dirty = new Set();
let frame = 0;
function scheduleRender(part) {
  dirty.add(part);
  if (!frame) frame = requestAnimationFrame(flushRender);
}
function flushRender() {
  frame = 0;
  const box = $("messages");
  const stick = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
  for (const part of dirty) {
    if (part === state.segment && part.source.length > SETTLE) {
      // What the tail can no longer change is shown for good, in its own part:
      // a long answer costs each frame its last few paragraphs, not its length
      // (and what is shown above the tail can be selected while it streams).
      const cut = settled(part.source);
      if (cut > 0) {
        const rest = part.source.slice(cut);
        part.source = part.source.slice(0, cut);
        closeSegment();
        const next = segment();
        next.source = rest;
        renderInto(next, rest, true);
        continue;
      }
    }
    renderInto(part, part.source, true);
  }
  dirty.clear();
  if (stick) box.scrollTop = box.scrollHeight;
}
// Where a streaming text may be cut in two without changing what either half
// shows: at a blank line outside a code fence followed by a whole line that starts
// in the first column and is not a list item (no list, list item or code block goes
// on across it).  0: nowhere yet.
const SETTLE = 1500;
function settled(src) {
  let fence = null, cut = 0, blank = false, at = 0;
  for (const line of src.split("\n")) {
    const start = at;
    at += line.length + 1;
    const mark = /^ {0,3}(`{3,}|~{3,})/.exec(line);
    if (fence) {
      if (mark && mark[1][0] === fence[0] && mark[1].length >= fence.length
          && !line.slice(mark[0].length).trim()) fence = null;
      blank = false;
      continue;
    }
    // (A list item is never cut off its list: the list would render differently.)
    if (blank && at <= src.length && /^\S/.test(line) && !/^(?:[-+*]|\d{1,9}[.)])(?:\s|$)/.test(line)) {
      cut = start;
    }
    if (mark) fence = mark[1];
    blank = !line.trim();
  }
  return cut;
}
function finishPart(part) {
  if (!part) return;
  dirty.delete(part);
  renderInto(part, part.source, false);
}

function announce(text) { $("announce").textContent = text; }

// -- conversations -----------------------------------------------------------------
async function loadList() {
  const page = await api("GET", "/conversations?limit=100");
  const list = $("conversations");
  list.replaceChildren();
  for (const c of page.items) {
    const li = el("li", c.id === state.current ? "active" : "");
    li.dataset.id = c.id;
    const open = el("button");
    open.type = "button";
    open.append(el("span", "title", c.title || "Untitled"), el("span", "when", when(c.updated_at)));
    if (c.id === state.current) open.setAttribute("aria-current", "page");
    // The conversation already open (or opening) is not read again: clicking it
    // only brings the reader back to the composer.
    open.onclick = () => {
      closeDrawer();
      if (c.id === state.current) { if (!$("input").disabled) $("input").focus(); return; }
      openConversation(c.id);
    };
    li.append(open);
    list.append(li);
  }
  filterList();
}

function filterList() {
  const words = $("filter").value.toLowerCase().split(/\s+/).filter(Boolean);
  for (const li of $("conversations").children) {
    const title = li.querySelector(".title").textContent.toLowerCase();
    li.hidden = !words.every((w) => title.includes(w));
  }
}

// -- search ------------------------------------------------------------------------
// The box filters the list by title at once and, after a pause (or Enter), asks the
// server for the messages holding its words, in every conversation this token may
// see: each one found opens its conversation at that message.
let searchTimer = 0, searchSeq = 0;
function searchSoon() {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => searchMessages(0), 350);
}
async function searchMessages(offset) {
  const q = $("filter").value.trim();
  const seq = ++searchSeq;
  if (!/[\p{L}\p{N}]/u.test(q)) { $("found").hidden = true; $("found-list").replaceChildren(); return; }
  let page;
  try { page = await api("GET", "/search?q=" + encodeURIComponent(q) + "&limit=20&offset=" + offset); }
  catch (err) {
    if (seq !== searchSeq || err instanceof Unauthorized) return;
    $("found").hidden = false;
    $("found-what").textContent = "Search failed: " + err.message;
    return;
  }
  if (seq !== searchSeq) return;  // the box changed meanwhile
  const list = $("found-list");
  if (!offset) list.replaceChildren();
  for (const h of page.items) {
    const open = el("button");
    open.type = "button";
    open.append(el("span", "title", h.conversation_title || "Untitled"),
                el("span", "snippet", (h.kind === "user" ? (h.author || "you") : state.assistant) + ": " + h.snippet),
                el("span", "when", when(h.created_at)));
    open.onclick = () => {
      closeDrawer();
      openConversation(h.conversation_id).then(() => markFound(h.message_id)).catch(() => {});
    };
    const li = el("li");
    li.append(open);
    list.append(li);
  }
  const n = list.children.length;
  const more = page.next_offset !== null;
  $("found-what").textContent = n ? n + (more ? "+" : "") + (n === 1 && !more ? " message" : " messages")
    + " found" : "No message holds these words.";
  $("found-more").hidden = !more;
  $("found-more").onclick = () => searchMessages(page.next_offset);
  $("found").hidden = false;
}
// The message found, shown and marked in its conversation (older pages of its history
// are loaded until it is there).
async function markFound(messageId) {
  const id = state.current;
  let m;
  while (!(m = document.querySelector('#messages [data-mid="' + messageId + '"]'))
         && state.older !== null && state.current === id) await loadOlder();
  const bubble = m && m.closest(".msg");
  if (!bubble) return;
  for (const old of document.querySelectorAll("#messages .msg.found")) old.classList.remove("found");
  bubble.classList.add("found");
  bubble.scrollIntoView({ block: "center" });
}

// -- addresses ---------------------------------------------------------------------
// Each conversation has its own address, /c/<id> (the id one encoded segment): a
// reload, back and forward, and a link someone was given open it again.
const ROUTE = "/c/";
function routeId() {
  const path = location.pathname;
  if (!path.startsWith(ROUTE)) return null;
  try { return decodeURIComponent(path.slice(ROUTE.length)) || null; } catch (e) { return null; }
}
function routeTo(id, replace) {
  const path = id ? ROUTE + encodeURIComponent(id) : "/";
  if (location.pathname === path) return;
  history[replace ? "replaceState" : "pushState"]({ id: id || null }, "", path);
}
window.addEventListener("popstate", () => {
  const id = routeId();
  if (id === state.current) return;
  if (id) openConversation(id, { routed: true }).catch(() => {});
  else closeConversation();
});

// Nothing open: the empty view (after a delete, or back to the start page).
function closeConversation(text) {
  if (state.stream) state.stream.abort();
  state.current = null; state.running = null; state.bubble = null; state.segment = null;
  state.lastUser = ""; state.older = null;
  setTitle("");
  $("title").textContent = "No conversation";
  document.title = "agentik";
  later.length = 0;
  $("messages").replaceChildren(el("div", "empty", text || "Pick a conversation or start a new one."));
  $("input").disabled = $("send").disabled = $("delete").disabled = $("stop").disabled = true;
  $("rename").disabled = $("attach").disabled = true;
  setStatus("");
  for (const li of $("conversations").children) {
    li.classList.remove("active");
    li.querySelector("button").removeAttribute("aria-current");
  }
}

async function openConversation(id, opts) {
  let opened;
  state.opening = new Promise((resolve) => { opened = resolve; });
  try { return await openOne(id, opts); } finally { opened(); }
}

async function openOne(id, opts) {
  // Where the focus was when opening began: the message box takes it at the end
  // only if the user has not moved it meanwhile (to Rename, the search box...).
  const focusWas = document.activeElement;
  // The address follows the open conversation (not when the address opened it).
  if (!(opts && opts.routed)) routeTo(id);
  if (state.stream) state.stream.abort();
  // Nothing of the previous conversation (its title, its "live" status) may
  // stand for this one, and no message is sent into it until it is followed.
  state.current = id; state.running = null; state.bubble = null; state.segment = null; state.title = ""; state.joined = null;
  state.lastUser = ""; state.older = null;
  stopEditing();
  $("input").disabled = $("send").disabled = $("stop").disabled = $("attach").disabled = true;
  setStatus("connecting…");
  for (const li of $("conversations").children) {
    li.classList.toggle("active", li.dataset.id === id);
    const b = li.querySelector("button");
    if (li.dataset.id === id) b.setAttribute("aria-current", "page"); else b.removeAttribute("aria-current");
  }
  // Subscribe first, then read the history: nothing said in between is lost,
  // and what the stream says meanwhile waits until the history is shown.  The
  // conversation itself is asked for at the same time (one round trip less).
  let shown;
  state.ready = new Promise((resolve) => { shown = resolve; });
  const reading = api("GET", conversationPath(id));
  const following = follow(id, reading.catch(() => {}));
  let conv;
  try { conv = await reading; }
  catch (err) {
    shown();
    // A link to a conversation deleted since, or another token's: say so.
    if (state.current === id && !(err instanceof Unauthorized)) {
      closeConversation("There is no conversation at this address (deleted, or not yours to see).");
      $("title").textContent = "Not found";
    }
    throw err;
  }
  if (state.current !== id) { shown(); return; }  // another one was opened meanwhile
  setTitle(conv.title);
  $("delete").disabled = $("rename").disabled = false;
  try {
    await following;
    if (state.current !== id) return;
    const running = await loadHistory(id, conv.running_run_id, true);
    if (state.current !== id) return;
    if (running && !state.done.has(running)) {
      startTurn(running);
      state.joined = running;  // (if its first pieces could not be replayed, its end shows them)
    }
  } finally { shown(); }
  $("input").disabled = $("send").disabled = $("attach").disabled = false;
  const focusNow = document.activeElement;
  if (!focusNow || focusNow === focusWas || focusNow === document.body) $("input").focus();
}

function setTitle(title) {
  state.title = title || "";
  $("title").textContent = state.title || "Untitled";
  document.title = (state.title || "Untitled") + " · agentik";
}

// The history comes in pages, the latest first, older ones as the reader scrolls up
// (or presses "Earlier messages"): opening a long conversation costs one page.
const PAGE = 50;

// Shows the latest page of the history and returns the run of the turn being
// written, if any.  ``running`` is the turn the conversation said was running
// when it was opened: if the status, asked after it, says that turn is over and
// the page read does not hold its answer, the turn ended while the history was
// read, and the history is read again (its answer is stored by then) rather
// than its question being shown as unanswered.  ``replayed``: the stream followed
// since before this read brings the turn being written from its start, so what
// the history holds of its answer (tool cards stored so far) is left to it.
async function loadHistory(id, running = null, replayed = false) {
  // The stored checklist and whether a turn runs, asked for with the history (and
  // awaited once the history is shown).
  const asked = api("GET", conversationPath(id) + "/status");
  asked.catch(() => {});
  const page = await pageOfTurns(id, null);
  if (state.current !== id) return null;
  const box = $("messages");
  state.branchedFrom = new Set();
  const got = historyNodes(id, page.items, page.more);
  state.older = got.before;
  // A turn whose last row is its answer is whole here; one that ends in a user
  // message or a tool call is still being written (its events will follow).
  state.done = new Set([...got.last].filter(([, kind]) => kind === "assistant").map(([run]) => run));
  state.lastUser = got.lastUser;
  later.length = 0;  // what was left to render belonged to the messages replaced here
  box.replaceChildren(got.shown);
  if (state.older !== null) box.prepend(earlierButton());
  if (!page.items.length) box.append(el("div", "empty", "Say hello."));
  box.scrollTop = box.scrollHeight;
  const status = await asked;
  if (state.current !== id) return null;
  if (running && status.run_id !== running && !state.done.has(running)) return loadHistory(id, null, replayed);
  if (replayed && status.run_id && !state.done.has(status.run_id) && got.answers.has(status.run_id)) {
    got.answers.get(status.run_id).remove();
  }
  // The stored checklist, as it stands (later changes come as todo_updated).
  if (status.todo && status.todo.items.length) showTodo(status.todo.run_id || "stored", status.todo.items);
  // A turn that ended without an answer and is neither running nor waiting its
  // turn failed: say so where its answer would be (the reason is in the bot's log).
  const unanswered = [...got.last].filter(([run, kind]) => kind !== "assistant" && run !== status.run_id)
    .map(([run]) => run);
  unansweredFailed(got, unanswered.slice(0, unanswered.length - (status.queued || 0)));
  return status.run_id || null;
}

function unansweredFailed(got, runs) {
  for (const run of runs) {
    let b = got.answers.get(run);
    if (!b && got.userOf.has(run)) { b = assistantBubble(); got.userOf.get(run).after(b); }
    if (b) b.append(failure("No answer: this turn failed. The reason is in the bot's log."));
  }
}

// The question that starts a turn (not one steered into a running turn, not a note).
function startsTurn(m) {
  return m.kind === "user" && m.run_id && !(m.data && (m.data.steered || m.data.ambient));
}

// A page of the history before the row ``before`` (null: the latest), with as many
// older rows as it takes to hold the start of its first turn: a turn longer than a
// page (many tool calls) is read whole, so its rows are shown in one answer, in
// order, their results with their calls.  ``more``: older rows are left.
async function pageOfTurns(id, before) {
  const path = conversationPath(id) + "/messages?limit=";
  let page = await api("GET", path + PAGE + (before === null ? "" : "&before=" + before));
  let items = page.items, more = page.prev_before !== null;
  // Rows of a turn whose question is older (the page starts inside it, with no turn
  // of its own after): read further back, in bigger pages, until its question.
  while (more && items.length && !items.some(startsTurn)
         && items.some((m) => m.run_id && m.kind !== "user")) {
    page = await api("GET", path + (PAGE * 4) + "&before=" + items[0].id);
    items = page.items.concat(items);
    more = page.prev_before !== null;
  }
  return { items, more };
}

// One page of the history as nodes: questions, and each turn's answer as one message
// (its text and tool cards in the order they came).  A page that starts inside a turn
// leaves that turn's first rows to the page before it (``before``: where that one
// ends), so a turn is always shown whole (pageOfTurns read back to a turn's start).
function historyNodes(id, items, more) {
  const first = more ? items.findIndex(startsTurn) : 0;
  if (first > 0) items = items.slice(first);
  const shown = document.createDocumentFragment();
  const last = new Map();
  for (const m of items) if (m.run_id) last.set(m.run_id, m.kind);
  const answers = new Map();
  const answerOf = (run) => {
    let b = answers.get(run);
    if (!b) { b = assistantBubble(); answers.set(run, b); shown.append(b); }
    return b;
  };
  const calls = new Map();
  const userOf = new Map();  // run -> its question, after which a failed answer is said
  let lastUser = "";
  for (const m of items) {
    if (m.kind === "user") {
      const b = userBubble(m.author || "you", m.content);
      b.dataset.mid = m.id;
      const parts = (m.data && Array.isArray(m.data.parts)) ? m.data.parts : [];
      if (parts.length) b.append(partsOf(parts.filter((p) => p.sha256).map((p) => Object.assign({}, p,
        { url: API + conversationPath(id) + "/attachments/" + p.sha256 }))));
      shown.append(b);
      if (m.run_id) userOf.set(m.run_id, b);
      lastUser = m.content;
      if (m.data && m.data.branch_of) state.branchedFrom.add(m.data.branch_of);
    } else if (m.kind === "assistant" && (m.content || m.status === "error")) {
      const b = answerOf(m.run_id);
      if (m.content) {
        const part = el("div", "text");
        part.dataset.mid = m.id;
        b.append(part);
        renderLater(b, part, m.content);
      }
      if (m.status === "interrupted") b.classList.add("interrupted");
      // A failed turn: the audit log keeps why (data.error), shown as it was live.
      const error = m.data && m.data.error;
      if (m.status === "error") {
        b.append(failure(error ? shortError({ message: error.message, error_type: error.type })
          : m.content ? "The answer failed before it was complete." : "No answer: this turn failed."));
      }
    } else if (m.kind === "tool_call" && m.tool_name !== "todo") {
      calls.set(m.tool_call_id, toolCard(answerOf(m.run_id), m.tool_call_id, m.tool_name, m.arguments || ""));
    } else if (m.kind === "tool_result" && calls.has(m.tool_call_id)) {
      setToolResult(calls.get(m.tool_call_id), m.content, m.is_error);
    }
  }
  // Questions a later one replaced (regenerate, edit), and their answers: earlier
  // versions (the later question may be on a newer page).
  for (const m of items) {
    if (m.kind !== "user" || !state.branchedFrom.has(m.id)) continue;
    const q = shown.querySelector('.msg.user[data-mid="' + m.id + '"]');
    if (q) replaced(q);
    if (m.run_id && answers.has(m.run_id)) replaced(answers.get(m.run_id));
  }
  const before = !more || !items.length ? null : items[0].id;
  return { shown, before, last, answers, userOf, lastUser };
}

// The page before the oldest shown, put above it without moving what is on screen.
let olderLoading = null;
function earlierButton() {
  const b = el("button", "earlier", "Earlier messages");
  b.type = "button";
  b.onclick = () => loadOlder().catch(() => {});
  upper.observe(b);
  return b;
}
const upper = new IntersectionObserver((entries) => {
  if (entries.some((e) => e.isIntersecting)) loadOlder().catch(() => {});
}, { root: document.getElementById("messages"), rootMargin: "800px 0px 0px 0px" });
function loadOlder() {
  if (olderLoading) return olderLoading;
  if (state.older === null || state.older === undefined) return Promise.resolve();
  const id = state.current, from = state.older;
  olderLoading = (async () => {
    const page = await pageOfTurns(id, from);
    if (state.current !== id || state.older !== from) return;
    const got = historyNodes(id, page.items, page.more);
    // Turns of an older page have ended: one without an answer failed.
    unansweredFailed(got, [...got.last].filter(([, kind]) => kind !== "assistant").map(([run]) => run));
    const box = $("messages");
    const button = box.querySelector(".earlier");
    const anchor = button ? button.nextElementSibling : box.firstElementChild;
    const top = anchor ? anchor.getBoundingClientRect().top : 0;
    state.older = got.before;
    if (button) { upper.unobserve(button); button.remove(); }
    box.prepend(got.shown);
    if (state.older !== null) box.prepend(earlierButton());
    if (anchor) box.scrollTop += anchor.getBoundingClientRect().top - top;
  })().finally(() => { olderLoading = null; });
  return olderLoading;
}

function failure(text) {
  const f = el("div", "failure", "⚠ " + text);
  return f;
}

// The conversation's checklist (the model's todo tool): one per turn, updated in place.
function showTodo(runId, items) {
  const key = "todo:" + runId;
  let box = document.querySelector('.todo[data-id="' + CSS.escape(key) + '"]');
  if (!box) { box = el("div", "approval todo"); box.dataset.id = key; $("messages").append(box); }
  const marks = { done: "✓", in_progress: "▸", pending: "○" };
  const done = items.filter((it) => it.status === "done").length;
  box.replaceChildren(el("div", "text", "todo " + done + "/" + items.length),
    ...items.map((it) => el("div", "text", (marks[it.status] || "○") + " " + it.text)));
}

// The history again, in place of what is shown; an answer being written goes on
// in a fresh bubble below it.
async function reloadHistory(id) {
  state.bubble = null; state.segment = null;
  await loadHistory(id);
  if (state.current !== id) return;
  if (state.running && state.done.has(state.running)) endTurn();
  else if (state.running) startTurn(state.running);
}

// A long message (a pasted log) is shown cut, with a button for the rest: laying
// out 20,000 lines would hold the page up each time the chat is shown.
const LONG = { lines: 40, chars: 4000 };
// Linked channels (docs/links.md): an author qualified by network, "alice@libera" (IRC)
// or "Bob (Slack)", shows as the name and a badge of the network.
function linkedWho(who) {
  const span = el("span", "who");
  const m = /^(.+) \(([^()]+)\)$/.exec(who) || /^([^@\s]+)@([^@\s]+)$/.exec(who);
  if (!m) { span.textContent = who; return span; }
  const net = el("span", "net", m[2]);
  net.title = who.includes("@") && !who.endsWith(")") ? "IRC network " + m[2] : m[2];
  span.append(document.createTextNode(m[1] + " "), net);
  return span;
}

function userBubble(who, text) {
  const div = el("div", "msg user");
  let lines = 0, at = 0;
  while (lines < LONG.lines && at < LONG.chars && (at = text.indexOf("\n", at) + 1) > 0) lines++;
  const cut = lines >= LONG.lines ? at - 1 : text.length > LONG.chars ? LONG.chars : -1;
  div.append(linkedWho(who), el("div", "text", cut < 0 ? text : text.slice(0, cut)));
  if (cut >= 0) {
    const rest = text.slice(cut);
    const more = el("button", "more", "Show all (" + (text.split("\n").length).toLocaleString() + " lines, "
      + text.length.toLocaleString() + " characters)");
    more.type = "button";
    more.onclick = () => { div.querySelector(".text").append(rest); more.remove(); };
    div.append(more);
  }
  return div;
}

function assistantBubble() {
  const div = el("div", "msg assistant");
  div.append(el("span", "who", state.assistant));
  return div;
}

function show(node) {
  const box = $("messages");
  const empty = box.querySelector(".empty");
  if (empty) empty.remove();
  box.append(node);
  box.scrollTop = box.scrollHeight;
  return node;
}

function addMessage(kind, who, text) {
  const div = el("div", "msg " + kind);
  div.append(el("span", "who", who), el("div", "text", text));
  return show(div);
}

// A card of the turn being written (approval, question) goes into its answer, in
// order with its text; any other at the end.
function showInTurn(node, runId) {
  if (state.bubble && runId && runId === state.running) {
    closeSegment();
    state.bubble.append(node);
    $("messages").scrollTop = $("messages").scrollHeight;
    return node;
  }
  return show(node);
}

function addNotice(text) { show(el("div", "notice", text)); }

// A tool call as a card in its answer: name and arguments; its result when it ends.
function toolCard(bubble, callId, name, args) {
  const card = el("details", "tool");
  card.dataset.id = callId;
  card.append(el("summary", "", "⚙ " + name), el("pre", "args", shorten(args, 2000)));
  bubble.append(card);
  return card;
}

function setToolResult(card, result, isError) {
  if (isError) card.classList.add("failed");
  card.querySelector("summary").textContent += isError ? " — failed" : " — done";
  if (result) card.append(el("pre", "result", shorten(result, 4000)));
}

function shorten(text, limit) {
  return text.length > limit ? text.slice(0, limit) + "… (" + (text.length - limit) + " more characters)" : text;
}

// An error as the page shows it: short, and without addresses or keys (a model's
// URL, a token) that the raw message may carry; the whole of it is in the bot's log.
function shortError(ev) {
  let text = (ev.message || "").replace(/\b[a-z][a-z0-9+.-]*:\/\/\S+/gi, "(address hidden)")
    .replace(/\b(sk|xox[a-z]|ghp|Bearer)[-_ ]?[A-Za-z0-9_\-.]{6,}/g, "(secret hidden)");
  if (text.length > 160) text = text.slice(0, 160) + "…";
  return "The answer failed" + (ev.error_type ? " (" + ev.error_type + ")" : "") + (text ? ": " + text : ".");
}

// -- the event stream --------------------------------------------------------------
// Resolves once the stream is open; then keeps it open (reconnecting with
// Last-Event-ID) until another conversation is opened.
// ``read``: settles once the conversation itself is read (opened at the same time):
// until then the page does not say "live", as nothing may be sent into it yet.
function follow(id, read) {
  const ctrl = new AbortController();
  state.stream = ctrl;
  let lastId = null;
  // The first connection starts with the events of the turn being written, from its
  // start (``replay=turn``): the history read beside it leaves that turn's answer to
  // them (loadHistory's ``replayed``).  A reconnection resumes after the last event.
  let replay = "&replay=turn";
  return new Promise((connected) => {
    (async () => {
      while (!ctrl.signal.aborted) {
        try {
          const extra = lastId === null ? {} : { "Last-Event-ID": String(lastId) };
          const r = await fetch(API + conversationPath(id) + "/events?profile=chat" + replay,
                                { headers: headers(extra), signal: ctrl.signal });
          replay = "";
          if (r.status === 401) { askToken(); connected(); return; }
          if (!r.ok) { setStatus("not following: " + r.status); connected(); return; }
          await read;
          if (ctrl.signal.aborted) { connected(); return; }
          setStatus("live", true);
          connected();
          const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
          // events_lost as the first event of a connection: what was asked for
          // cannot be replayed (the buffer no longer reaches back, or the server
          // restarted and numbers events anew).  Later, it only means this stream
          // fell behind and ends: the reconnection replays from lastId.
          let first = true;
          let buffer = "", eventId = null, data = [];
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buffer += value;
            let nl;
            while ((nl = buffer.indexOf("\n")) >= 0) {
              let line = buffer.slice(0, nl);
              buffer = buffer.slice(nl + 1);
              if (line.endsWith("\r")) line = line.slice(0, -1);
              if (line === "") {
                if (data.length) {
                  if (eventId !== null) lastId = eventId;
                  const event = JSON.parse(data.join("\n"));
                  await state.ready;
                  if (state.current !== id) return;
                  if (event.kind === "events_lost" && first) {
                    // Nothing to replay from: start over from the history, and
                    // show the events after this one once it is shown.
                    lastId = null;
                    await reloadHistory(id).catch(() => {});
                    if (state.current !== id) return;
                  }
                  first = false;
                  onEvent(event);
                }
                data = []; eventId = null;
                continue;
              }
              if (line.startsWith(":")) continue;  // heartbeat
              const colon = line.indexOf(":");
              const field = colon < 0 ? line : line.slice(0, colon);
              let v = colon < 0 ? "" : line.slice(colon + 1);
              if (v.startsWith(" ")) v = v.slice(1);
              if (field === "id") eventId = parseInt(v, 10);
              else if (field === "data") data.push(v);
            }
          }
        } catch (e) {
          if (ctrl.signal.aborted) return;
        }
        connected();
        setStatus("reconnecting…");
        await new Promise((r) => setTimeout(r, 1000));
      }
    })();
  });
}

function setStatus(text, live) {
  $("status").textContent = text;
  $("status").classList.toggle("live", !!live);
}

function startTurn(runId) {
  state.running = runId;
  $("stop").disabled = false;
  if (!state.bubble) {
    state.bubble = show(assistantBubble());
    state.bubble.classList.add("writing");
    state.segment = null;
  }
}

// The text part being written, started after the last tool card if need be.
function segment() {
  if (!state.segment) {
    state.segment = el("div", "text");
    state.segment.source = "";
    state.bubble.append(state.segment);
  }
  return state.segment;
}

function closeSegment() {
  finishPart(state.segment);
  state.segment = null;
}

function endTurn() {
  closeSegment();
  if (state.bubble) state.bubble.classList.remove("writing");
  // An answer with nothing in it (a turn that only asked, or ended silently) is not shown.
  if (state.bubble && state.bubble.childElementCount === 1) state.bubble.remove();
  state.bubble = null;
  state.running = null;
  $("stop").disabled = true;
}

// What the history shows of a turn it holds whole.
const SHOWN_BY_HISTORY = new Set(["turn_started", "text_delta", "tool_call_started", "tool_call_ended",
                                  "interrupted", "turn_ended"]);

function onEvent(ev) {
  if (ev.run_id && state.done.has(ev.run_id) && SHOWN_BY_HISTORY.has(ev.kind)) return;
  switch (ev.kind) {
    case "turn_started": startTurn(ev.run_id); break;
    case "text_delta": {
      if (!state.bubble) startTurn(ev.run_id);
      const part = segment();
      part.source += ev.text;
      scheduleRender(part);
      break;
    }
    case "tool_call_started":  // ask_user and todo show themselves
      if (ev.name !== "ask_user" && ev.name !== "todo") {
        if (!state.bubble) startTurn(ev.run_id);
        closeSegment();
        toolCard(state.bubble, ev.call_id, ev.name, ev.arguments || "");
        $("messages").scrollTop = $("messages").scrollHeight;
      }
      break;
    case "tool_call_ended": {
      const card = document.querySelector('.tool[data-id="' + CSS.escape(ev.call_id) + '"]');
      if (card) setToolResult(card, ev.result, ev.is_error);
      else if (ev.is_error && ev.name !== "ask_user" && ev.name !== "todo") addNotice("⚠ " + ev.name + " failed");
      break;
    }
    case "approval_requested": addApproval(ev); break;
    case "approval_resolved": {
      const box = document.querySelector('.approval[data-id="' + CSS.escape(ev.approval_id) + '"]');
      const by = ev.approver ? " by " + ev.approver : "";
      const text = "approval " + ev.approval_id + " (" + ev.name + "): " + ev.decision + by
        + (ev.reason ? ": " + ev.reason : "");
      if (box) { box.replaceChildren(el("span", "text", text)); box.classList.add("decided"); }
      else addNotice(text);
      break;
    }
    case "question_asked": addQuestion(ev); break;
    case "question_answered": {
      const box = document.querySelector('.question[data-id="' + CSS.escape(String(ev.question_id)) + '"]');
      const text = ev.outcome === "answered"
        ? (ev.answered_by || "someone") + " answered: " + ev.answer
        : (ev.outcome === "expired" ? "nobody answered in time" : "question cancelled");
      if (box) {
        for (const b of box.querySelectorAll("button, form")) b.remove();
        box.append(el("div", "text", box.formText ? box.formText(ev) : text));
        box.classList.add("decided");
      } else addNotice(text);
      break;
    }
    case "todo_updated":
      showTodo(ev.run_id, ev.items);
      break;
    case "tool_progress": {
      // One line per running call, updated in place.
      const key = "progress:" + ev.call_id;
      let line = document.querySelector('.notice[data-id="' + CSS.escape(key) + '"]');
      if (!line) { line = el("div", "notice"); line.dataset.id = key; show(line); }
      const how = ev.total ? Math.round(100 * ev.progress / ev.total) + "%" : String(ev.progress);
      line.textContent = "⚙ " + ev.name + ": " + how + (ev.message ? " " + ev.message : "");
      break;
    }
    case "interrupted": if (state.bubble) state.bubble.classList.add("interrupted"); break;
    case "error": {
      // In the answer it belongs to; one announcement.
      if (!state.bubble) startTurn(ev.run_id);
      closeSegment();
      const f = failure(shortError(ev));
      f.setAttribute("role", "alert");
      state.bubble.append(f);
      state.failed = true;
      break;
    }
    case "turn_ended": {
      if (state.bubble && ev.text && state.joined === ev.run_id && !state.bubble.querySelector(".tool")) {
        // Opened while this answer was being written: the pieces sent before the page
        // followed it are missing, so the whole answer replaces what was shown of it.
        for (const part of [...state.bubble.querySelectorAll(".text")]) part.remove();
        state.segment = null;
      }
      state.joined = null;
      if (state.bubble && ev.text && !state.bubble.querySelector(".text")) segment().source = ev.text;
      const answered = state.bubble && !state.failed;
      const text = state.bubble ? [...state.bubble.querySelectorAll(".text")].map((p) => p.source || "").join(" ") : "";
      endTurn();
      // One announcement per answer (none per piece of it).
      if (answered) announce(state.assistant + ": " + shorten(text.trim(), 300));
      state.failed = false;
      loadList().catch(() => {});
      break;
    }
  }
}

// The model asks (ask_user): the question, and its choices as buttons; typing an
// answer in the message box answers too (the next message is the answer).
function addQuestion(ev) {
  const box = el("div", "approval question");
  box.dataset.id = String(ev.question_id);
  const who = ev.to ? "@" + ev.to + ": " : "";
  if (ev.form && ev.form.length) { addForm(box, ev, who); return; }
  box.append(el("span", "text", (ev.resumed ? "(asked again) " : "") + who + ev.question));
  if (ev.choices && ev.choices.length) box.append(el("br"));
  for (const choice of ev.choices || []) {
    const b = el("button", "choice", choice);
    b.type = "button";
    b.onclick = () => { for (const x of box.querySelectorAll("button")) x.disabled = true;
                        send(choice).catch((err) => addNotice(err.message)); };
    box.append(b);
  }
  showInTurn(box, ev.run_id);
}

// Several questions at once (a form): a labelled input or select each (the model's
// words as text, never HTML), sent together as a JSON body; a line typed in the
// message box answers the first question still open.
function addForm(box, ev, who) {
  const id = state.current;
  const form = el("form", "askform");
  const set = el("fieldset");
  set.append(el("legend", "", (ev.resumed ? "(asked again) " : "") + who + ev.question));
  const answered = new Set(ev.answered || []);
  const inputs = [];
  ev.form.forEach((f, i) => {
    if (answered.has(f.id)) return;
    const label = el("label");
    label.append(el("span", "", (i + 1) + ". " + f.text + (f.required ? "" : " (optional)")));
    let input;
    if (f.choices && f.choices.length) {
      input = el("select");
      const none = el("option", "", f.required ? "choose…" : "(no answer)");
      none.value = "";
      input.append(none);
      for (const c of f.choices) { const o = el("option", "", c); o.value = c; input.append(o); }
    } else {
      input = el("input");
      input.type = "text";
      input.maxLength = 4000;
    }
    input.name = f.id;
    input.required = !!f.required;
    label.append(input);
    set.append(label);
    inputs.push(input);
  });
  const error = el("div", "error");
  error.setAttribute("role", "alert");
  const send = el("button", "", "Send answers");
  send.type = "submit";
  set.append(error, send);
  form.append(set);
  form.onsubmit = async (e) => {
    e.preventDefault();
    const answers = {};
    for (const input of inputs) answers[input.name] = input.value;
    send.disabled = true;
    error.textContent = "";
    try {
      await api("POST", conversationPath(id) + "/questions/" + encodeURIComponent(ev.question_id),
                { answers });
    } catch (err) {
      if (!(err instanceof Unauthorized)) error.textContent = err.message;
      send.disabled = false;
    }
  };
  // How it ended: each question with its answer.
  box.formText = (done) => {
    if (done.outcome !== "answered") {
      return done.outcome === "expired" ? "not every question was answered in time" : "questions cancelled";
    }
    let got = {};
    try { got = JSON.parse(done.answer) || {}; } catch (_) { got = {}; }
    const lines = ev.form.map((f) => f.text + " " + (got[f.id] == null ? "—" : got[f.id]));
    return (done.answered_by || "someone") + " answered: " + lines.join("; ");
  };
  box.append(form);
  showInTurn(box, ev.run_id);
}

// A tool call waits for approval: who asked, the tool, its (masked) arguments, two buttons.
function addApproval(ev) {
  const id = state.current;
  const box = el("div", "approval");
  box.dataset.id = ev.approval_id;
  const text = "approval " + ev.approval_id + ": " + (ev.asker || "someone") + " asked to run "
    + ev.name + "(" + ev.arguments + ")";
  const decide = (decision) => async () => {
    for (const b of box.querySelectorAll("button")) b.disabled = true;
    try {
      await api("POST", conversationPath(id) + "/approvals/" + encodeURIComponent(ev.approval_id),
                { decision });
    } catch (err) {
      if (!(err instanceof Unauthorized)) addNotice(err.message);
      for (const b of box.querySelectorAll("button")) b.disabled = false;
    }
  };
  const approve = el("button", "approve", "Approve");
  const deny = el("button", "deny", "Deny");
  approve.type = deny.type = "button";
  approve.onclick = decide("approve");
  deny.onclick = decide("deny");
  // Only the buttons this token may use: the server says (may_approve, may_deny).
  approve.hidden = deny.hidden = true;
  box.append(el("span", "text", text), el("br"), approve, deny);
  showInTurn(box, ev.run_id);
  api("GET", conversationPath(id) + "/approvals").then((list) => {
    const mine = (list.items || []).find((a) => a.id === ev.approval_id);
    if (!mine || box.classList.contains("decided")) return;
    approve.hidden = !mine.may_approve;
    deny.hidden = !mine.may_deny;
    if (approve.hidden && deny.hidden) {
      box.append(el("span", "waiting", "waiting for " + mine.approvers
                    + " approval (you may not decide this one)"));
    }
  }).catch(() => {});
}

// -- actions -----------------------------------------------------------------------
async function send(text, files) {
  files = files || [];
  if (!state.current || (!text.trim() && !files.length)) return;
  const id = state.current;
  const bubble = show(userBubble("you", text));
  if (files.length) bubble.append(partsOf(files));
  state.lastUser = text;
  // An image on its own is a message: no words are made up for it.
  const body = text.trim() ? { content: text } : {};
  if (files.length) body.attachments = files.map((a) => ({ sha256: a.sha256, name: a.name }));
  // The server names an untitled conversation after its first message.
  const accepted = await api("POST", conversationPath(id) + "/messages", body);
  if (state.current === id) setTitle(accepted.title);
  loadList().catch(() => {});
}

async function newConversation() {
  const conv = await api("POST", "/conversations", {});
  await loadList();
  closeDrawer();
  await openConversation(conv.id);
}

async function stop() {
  if (!state.current || !state.running) return;
  $("stop").disabled = true;
  try { await api("POST", conversationPath(state.current) + "/interrupt", { run_id: state.running }); }
  catch (err) { if (!(err instanceof Unauthorized)) addNotice(err.message); }
}

// Regenerate and edit-and-resend start a new branch: the server takes the last
// question (and its answer) out of the model's context and keeps them in the audit
// log; here they stay on screen, marked as an earlier version.
function markReplaced() {
  const all = [...$("messages").querySelectorAll(".msg")];
  const from = all.map((m) => m.classList.contains("user")).lastIndexOf(true);
  const marked = from < 0 ? [] : all.slice(from).filter((m) => !m.classList.contains("replaced"));
  for (const m of marked) replaced(m);
  return marked;
}
function replaced(bubble) {
  bubble.classList.add("replaced");
  const who = bubble.querySelector(".who");
  if (who && !who.dataset.was) { who.dataset.was = who.textContent; who.textContent += " · earlier version"; }
}
function unmark(bubbles) {
  for (const m of bubbles) {
    m.classList.remove("replaced");
    const who = m.querySelector(".who");
    if (who && who.dataset.was) { who.textContent = who.dataset.was; delete who.dataset.was; }
  }
}
async function branch(path, body, text) {
  const id = state.current;
  const marked = markReplaced();
  const bubble = show(userBubble("you", text));
  try {
    await api("POST", conversationPath(id) + path, body);
    state.lastUser = text;
  } catch (err) {
    bubble.remove(); unmark(marked);
    if (!(err instanceof Unauthorized)) addNotice(err.message);
  }
}

// Edit the last question: it comes back into the box; sending replaces it.
async function editLast() {
  await state.opening;
  if (!state.lastUser || $("input").disabled) return;
  state.editing = true;
  $("editing").hidden = false;
  $("input").value = state.lastUser;
  $("input").focus();
  $("input").setSelectionRange(state.lastUser.length, state.lastUser.length);
}
function stopEditing() {
  state.editing = false;
  $("editing").hidden = true;
}

async function regenerate() {
  await state.opening;
  if (!state.lastUser || $("input").disabled) return;
  if (state.running) { addNotice("An answer is being written: stop it first (Alt+Shift+S)."); return; }
  branch("/regenerate", {}, state.lastUser).catch(() => {});
}

function copyLastCode() {
  const blocks = document.querySelectorAll("#messages .msg.assistant pre code");
  if (blocks.length) copyText(blocks[blocks.length - 1].textContent);
}

// Dark mode follows the system until the toggle says otherwise (kept in this browser).
function applyTheme(theme) {
  const dark = theme ? theme === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
  $("theme").setAttribute("aria-pressed", String(dark));
}
function toggleTheme() {
  const dark = document.documentElement.dataset.theme !== "dark";
  localStorage.setItem("agentik.theme", dark ? "dark" : "light");
  applyTheme(dark ? "dark" : "light");
}
applyTheme(localStorage.getItem("agentik.theme"));
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => applyTheme(localStorage.getItem("agentik.theme")));

function openDrawer() {
  document.body.classList.add("drawer");
  $("menu").setAttribute("aria-expanded", "true");
  const first = document.querySelector("#conversations li.active button") || $("new");
  first.focus();
}
function closeDrawer() {
  if (!document.body.classList.contains("drawer")) return;
  document.body.classList.remove("drawer");
  $("menu").setAttribute("aria-expanded", "false");
}

// A very long paste (a log, a file) is kept beside the box, not in it: a textarea
// holding 20,000 lines takes a second to lay out at each change.  It is sent after
// what is typed.
const BIG_PASTE = 20_000;
let pasted = "";
function setPasted(text) {
  pasted = text;
  $("pasted").hidden = !text;
  $("pasted-what").textContent = text ? "Pasted text: " + text.split("\n").length.toLocaleString()
    + " lines, " + text.length.toLocaleString() + " characters (sent with your message)" : "";
}
$("input").addEventListener("paste", (e) => {
  const text = e.clipboardData && e.clipboardData.getData("text/plain");
  if (!text || text.length < BIG_PASTE) return;
  e.preventDefault();
  setPasted(pasted ? pasted + "\n" + text : text);
  announce("Pasted text kept beside the message box");
});
$("pasted-drop").onclick = () => { setPasted(""); $("input").focus(); };

$("composer").onsubmit = (e) => {
  e.preventDefault();
  const typed = $("input").value;
  const text = pasted ? (typed.trim() ? typed + "\n\n" : "") + pasted : typed;
  $("input").value = "";
  setPasted("");
  if (state.editing && text.trim()) { stopEditing(); branch("/edit", { content: text }, text); return; }
  stopEditing();
  const files = attached.splice(0);
  showAttached();
  send(text, files).catch((err) => addMessage("error", "error", err.message));
};

// -- images and files in: the attach button, a pasted or dropped image ---------------
// Uploaded at once (POST .../attachments: the server checks size and type), sent
// with the next message by hash; thumbnails are fetched with the token (an <img>
// cannot send it) and shown from blob: URLs.
const attached = [];
async function uploadFile(file) {
  if (!state.current) return;
  const form = new FormData();
  form.append("file", file, file.name || "pasted.png");
  const r = await fetch(API + conversationPath(state.current) + "/attachments",
                        { method: "POST", headers: headers(), body: form });
  if (r.status === 401) { askToken(); throw new Unauthorized(); }
  const data = await r.json();
  if (!r.ok) throw new Error(data.error ? data.error.message : r.statusText);
  attached.push(data);
  showAttached();
  announce("Attached " + (data.name || "a file"));
}
function uploadAll(files) {
  for (const f of files) uploadFile(f).catch((err) => { if (!(err instanceof Unauthorized)) addNotice(err.message); });
}
function thumb(url) {
  const img = el("img", "thumb");
  img.alt = "";
  fetch(url, { headers: headers() }).then((r) => r.ok ? r.blob() : null)
    .then((b) => { if (b) img.src = URL.createObjectURL(b); }).catch(() => {});
  return img;
}
function partsOf(parts) {
  const box = el("div", "parts");
  for (const p of parts) {
    const chip = el("span", "chip");
    if (p.kind === "image" && p.url) chip.append(thumb(p.url));
    else chip.append(el("span", "", p.name || p.media_type || "file"));
    box.append(chip);
  }
  return box;
}
function showAttached() {
  const box = $("attached");
  box.replaceChildren(...attached.map((a, i) => {
    const chip = el("span", "chip");
    if (a.kind === "image") chip.append(thumb(a.url));
    chip.append(el("span", "", a.name || a.media_type));
    const drop = el("button", "", "×");
    drop.type = "button";
    drop.setAttribute("aria-label", "Remove " + (a.name || "the attachment"));
    drop.onclick = () => { attached.splice(i, 1); showAttached(); $("input").focus(); };
    chip.append(drop);
    return chip;
  }));
  box.hidden = !attached.length;
}
$("attach").onclick = () => $("attach-file").click();
$("attach-file").onchange = () => { uploadAll([...$("attach-file").files]); $("attach-file").value = ""; };
$("input").addEventListener("paste", (e) => {
  const files = [...((e.clipboardData && e.clipboardData.files) || [])];
  if (!files.length) return;
  e.preventDefault();
  uploadAll(files);
});
$("composer").addEventListener("dragover", (e) => { if (e.dataTransfer && [...e.dataTransfer.types].includes("Files")) e.preventDefault(); });
$("composer").addEventListener("drop", (e) => {
  const files = [...((e.dataTransfer && e.dataTransfer.files) || [])];
  if (!files.length) return;
  e.preventDefault();
  uploadAll(files);
});
$("input").onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); $("composer").requestSubmit(); }
  else if (e.key === "Escape" && state.editing) { e.preventDefault(); e.stopPropagation(); stopEditing(); $("input").value = ""; }
  else if (e.key === "ArrowUp" && !$("input").value) { e.preventDefault(); editLast(); }
};
$("new").onclick = () => newConversation();
$("stop").onclick = () => stop();
// Delete, once the dialog is answered "Delete" (Cancel has the focus).
$("delete").onclick = () => {
  if (!state.current) return;
  $("confirm-what").textContent = "“" + (state.title || "Untitled")
    + "” and all of its history will be deleted. This cannot be undone.";
  $("confirm-delete").returnValue = "";
  $("confirm-delete").showModal();
};
$("confirm-delete").addEventListener("close", async () => {
  const id = state.current;
  if ($("confirm-delete").returnValue !== "delete" || !id) { $("delete").focus(); return; }
  try { await api("DELETE", conversationPath(id)); }
  catch (err) { if (!(err instanceof Unauthorized)) addNotice("Not deleted: " + err.message); return; }
  if (state.current === id) { closeConversation(); routeTo(null, true); }
  announce("Conversation deleted");
  await loadList();
  $("new").focus();
});

// Rename in place: the title becomes a field; Enter or leaving it saves, Esc cancels.
function startRename() {
  if (!state.current) return;
  const edit = $("title-edit");
  edit.value = state.title;
  $("title").hidden = true; $("rename").hidden = true; edit.hidden = false;
  edit.focus(); edit.select();
}
async function finishRename(save) {
  const edit = $("title-edit");
  if (edit.hidden) return;
  edit.hidden = true; $("title").hidden = false; $("rename").hidden = false;
  const id = state.current;
  const title = edit.value.trim();
  $("rename").focus();
  if (!save || !id || title === state.title) return;
  try {
    const conv = await api("PATCH", conversationPath(id), { title });
    if (state.current === id) setTitle(conv.title);
    announce("Renamed to " + (conv.title || "Untitled"));
    await loadList();
  } catch (err) { if (!(err instanceof Unauthorized)) addNotice("Not renamed: " + err.message); }
}
$("rename").onclick = startRename;
$("title-edit").addEventListener("keydown", (e) => {
  if (e.key === "Enter") { e.preventDefault(); finishRename(true); }
  else if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); finishRename(false); }
});
$("title-edit").addEventListener("blur", () => finishRename(true));
$("filter").oninput = () => { filterList(); searchSoon(); };
$("filter").addEventListener("keydown", (e) => {
  if (e.key === "Enter") { e.preventDefault(); clearTimeout(searchTimer); searchMessages(0); }
});
$("theme").onclick = toggleTheme;
$("keys").onclick = () => $("help").showModal();
$("menu").onclick = () => document.body.classList.contains("drawer") ? closeDrawer() : openDrawer();
$("backdrop").onclick = closeDrawer;
$("messages").addEventListener("click", (e) => {
  const copy = e.target.closest(".copy");
  if (copy) copyText(copy.parentNode.querySelector("code").textContent, copy);
});
document.addEventListener("keydown", (e) => {
  if ($("auth").classList.contains("open") || $("help").open || $("confirm-delete").open) return;
  const typing = e.target.matches("input, textarea");
  if (e.key === "Escape") {
    if (document.body.classList.contains("drawer")) { closeDrawer(); $("menu").focus(); }
    else if (state.running) stop();
    return;
  }
  if (e.altKey && e.shiftKey && !e.ctrlKey && !e.metaKey) {
    const action = {
      KeyN: newConversation, KeyK: () => { if (matchMedia("(max-width: 767px)").matches) openDrawer(); $("filter").focus(); },
      KeyS: stop, KeyC: copyLastCode, KeyR: regenerate, KeyE: editLast, KeyL: toggleTheme,
      KeyM: () => $("input").focus(),
    }[e.code];
    if (action) { e.preventDefault(); Promise.resolve(action()).catch(() => {}); }
    return;
  }
  if (e.key === "?" && !typing && !e.ctrlKey && !e.metaKey) { e.preventDefault(); $("help").showModal(); }
});
$("auth-form").onsubmit = async (e) => {
  e.preventDefault();
  state.token = $("token").value.trim();
  localStorage.setItem("agentik.token", state.token);
  $("auth").classList.remove("open");
  start();
};

async function start() {
  try { await loadList(); } catch (err) { if (!(err instanceof Unauthorized)) setStatus(err.message); return; }
  // Opened at a conversation's address (a reload, a link): that conversation.
  const linked = routeId();
  if (linked && linked !== state.current) openConversation(linked, { routed: true }).catch(() => {});
  // The assistant's name: the agent's ([agent] name), unless it has none (a random id).
  api("GET", "/status").then((s) => {
    if (s.agent_id && !/^[0-9a-f]{32}$/.test(s.agent_id)) {
      state.assistant = s.agent_id;
      for (const who of document.querySelectorAll(".msg.assistant .who")) who.textContent = s.agent_id;
    }
  }).catch(() => {});
}
start();
