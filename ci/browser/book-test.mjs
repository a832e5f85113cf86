// Loads every page of the built book in headless Chromium, as a reader would, and fails
// on what a reader would see broken:
//   - an error in the browser console, or an uncaught exception on the page;
//   - a mermaid diagram that did not become an SVG, or that shows mermaid's error text
//     ("Syntax error", "Unsupported markdown"); a Gantt bar of zero or negative width, or
//     an axis whose labels repeat; text drawn outside the diagram, or a subgraph title
//     hidden under the boxes inside it;
//   - a link to a page of the book that does not exist, or to an anchor that is not on
//     its page; an image that did not load;
//   - a code block that wraps its lines or scrolls sideways at a desktop width (1280 px):
//     every <pre> keeps its lines as written (white-space: pre) and fits the column,
//     listings and outputs alike (outputs reach the page through book/tools/outputs.pl,
//     whose tables scroll in their own box and are not <pre>);
//   - at a phone's width (390 px), a <pre> whose hidden part is wider than the phone's
//     screen (scrollWidth - clientWidth > 390): more than one screen of sideways
//     scrolling;
//   - a figure whose text is smaller than 12 px as drawn at the column's width: an <img>
//     of an .svg (font-size x drawn width / viewBox width, from the file) and an inline
//     SVG such as a diagram (font-size x the SVG's scale on the screen);
//   - a search that finds nothing, or whose teasers show diagram source;
//   - a page of either edition (the Chinese one in zh-CN/, where it was built) without a
//     language switch to the same page in the other;
//   - a snapshot viewer whose peak is not lab-03 summary's;
//   - a calculator whose peaks are not `lab-10 --dry-run`'s ($LAB10) to the byte, that
//     answers GPT-2 small slower than 2 s, or that meets bad input with anything but
//     one line on the page.
// A screenshot of every page (at both widths), and of every diagram, goes to the
// screenshots folder.
//
// Usage: LAB10=target/debug/lab-10 node book-test.mjs BOOK_DIR SCREENSHOT_DIR
// (Chromium: $CHROMIUM or /usr/bin/chromium)

import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { readFile, readdir, mkdir, stat } from "node:fs/promises";
import { execFileSync } from "node:child_process";
import path from "node:path";

const bookDir = path.resolve(process.argv[2] ?? "book/book");
const shotDir = path.resolve(process.argv[3] ?? "ci/browser/screenshots");
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";

const TYPES = {
  ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript",
  ".css": "text/css", ".svg": "image/svg+xml", ".png": "image/png", ".json": "application/json",
  ".woff": "font/woff", ".woff2": "font/woff2", ".ttf": "font/ttf", ".txt": "text/plain",
  ".ico": "image/x-icon", ".wasm": "application/wasm",
};

async function exists(file) {
  try { return (await stat(file)).isFile(); } catch { return false; }
}

async function htmlPages(dir) {
  const out = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) out.push(...await htmlPages(full));
    else if (entry.name.endsWith(".html")) out.push(full);
  }
  return out;
}

// A static server for the built book, on a free loopback port.
function serve(root) {
  const server = createServer(async (req, res) => {
    const url = new URL(req.url, "http://localhost");
    let file = path.join(root, decodeURIComponent(url.pathname));
    if (!file.startsWith(root)) { res.writeHead(403).end(); return; }
    if (file.endsWith("/")) file += "index.html";
    try {
      const body = await readFile(file);
      res.writeHead(200, { "content-type": TYPES[path.extname(file)] ?? "application/octet-stream" });
      res.end(body);
    } catch {
      res.writeHead(404).end("not found");
    }
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(server)));
}

const problems = [];
const problem = (page, what) => problems.push(`${page}: ${what}`);

const server = await serve(bookDir);
const origin = `http://127.0.0.1:${server.address().port}`;
await mkdir(shotDir, { recursive: true });
const browser = await chromium.launch({
  executablePath,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
const PHONE_WIDTH = 390;
const phone = await browser.newContext({ viewport: { width: PHONE_WIDTH, height: 844 }, isMobile: true, hasTouch: true });
// The smallest text a figure may draw, in CSS pixels at the column's width.
const MIN_FIGURE_TEXT_PX = 12;

// Describes each <pre> of the page's content (diagrams aside): where it is (its number,
// its kind, the heading above it), whether its lines wrap, how far it scrolls sideways,
// and its longest line. Runs in the page.
function measurePres() {
  const content = document.querySelector("#mdbook-content main, main") ?? document.body;
  const wraps = (el) => {
    const cs = getComputedStyle(el);
    return cs.whiteSpace !== "pre" && !(cs.textWrapMode === "nowrap" && cs.whiteSpaceCollapse === "preserve")
      ? cs.whiteSpace : null;
  };
  const out = [];
  [...content.querySelectorAll("pre")].filter((p) => !p.closest(".mermaid") && !p.classList.contains("mermaid"))
    .forEach((pre, i) => {
      const code = pre.querySelector(":scope > code");
      const lang = code ? ([...code.classList].find((c) => c.startsWith("language-")) ?? "") : "";
      const kind = pre.closest(".output") ? "output" : lang ? lang.replace("language-", "```") : "<pre>";
      let heading = "";
      for (let el = pre; el && !heading; el = el.previousElementSibling ?? el.parentElement) {
        if (el === content) break;
        if (/^H[1-6]$/.test(el.tagName)) heading = el.textContent.trim();
      }
      const lines = (code ?? pre).textContent.split("\n");
      const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), "");
      const scroll = Math.max(pre.scrollWidth - pre.clientWidth, code ? code.scrollWidth - code.clientWidth : 0);
      out.push({
        n: i + 1, kind, heading: heading.slice(0, 50), wrap: wraps(pre) ?? (code ? wraps(code) : null),
        scroll, width: Math.max(pre.clientWidth, code?.clientWidth ?? 0),
        scrollWidth: Math.max(pre.scrollWidth, code?.scrollWidth ?? 0),
        longest: longest.length, line: longest.trim().slice(0, 60),
      });
    });
  return out;
}
const where = (p) => `<pre> ${p.n} (${p.kind}${p.heading ? `, under "${p.heading}"` : ""})`;

// Every page but the one-page print version (the same content, checked page by page) and
// the table of contents' frame, of each edition.
const pages = (await htmlPages(bookDir))
  .map((f) => path.relative(bookDir, f))
  .filter((f) => !["print.html", "toc.html"].includes(path.basename(f)))
  .sort();
// The Chinese edition, where it was built, lives in zh-CN/ beside the English root.
const hasEditions = pages.some((p) => p.startsWith("zh-CN/"));
const htmlCache = new Map();
async function pageHtml(rel) {
  if (!htmlCache.has(rel)) {
    const file = path.join(bookDir, rel);
    htmlCache.set(rel, (await exists(file)) ? await readFile(file, "utf8") : null);
  }
  return htmlCache.get(rel);
}

// The text of an SVG file of the book, or null.
async function fetchSvgText(urlPath) {
  const file = path.join(bookDir, decodeURIComponent(urlPath));
  return (await exists(file)) ? readFile(file, "utf8") : null;
}

// Each <text> of an SVG with the size it is drawn at when the picture is `drawnWidth` px
// wide: its font-size (its own, or an enclosing group's; 16 if none) x drawnWidth / the
// viewBox's width. Plotters and most generators write font-size as an attribute.
function svgTextSizes(svg, drawnWidth) {
  const root = svg.match(/<svg\b[^>]*>/)?.[0] ?? "";
  const viewBox = root.match(/viewBox="\s*[-\d.]+[\s,]+[-\d.]+[\s,]+([\d.]+)/)?.[1]
    ?? root.match(/\bwidth="([\d.]+)/)?.[1];
  const viewWidth = parseFloat(viewBox ?? "0");
  if (!viewWidth || !drawnWidth) return [];
  const sizeOf = (attrs) => attrs.match(/font-size[=:]\s*"?([\d.]+)/)?.[1];
  const out = [];
  const groups = [];
  for (const m of svg.matchAll(/<(\/?)(g|text)\b([^>]*)>([^<]*)/g)) {
    const [, close, tag, attrs, body] = m;
    if (tag === "g") {
      if (close) groups.pop();
      else if (!attrs.endsWith("/")) groups.push(sizeOf(attrs));
      continue;
    }
    if (close) continue;
    const size = parseFloat(sizeOf(attrs) ?? [...groups].reverse().find((g) => g) ?? "16");
    out.push({ text: body.trim().slice(0, 40), size: Math.round(size * 10) / 10, viewWidth,
               px: size * drawnWidth / viewWidth });
  }
  return out;
}

let diagrams = 0;
for (const rel of pages) {
  const page = await context.newPage();
  page.on("console", (m) => { if (m.type() === "error") problem(rel, `console error: ${m.text()}`); });
  page.on("pageerror", (e) => problem(rel, `page error: ${e.message}`));
  await page.goto(`${origin}/${rel}`, { waitUntil: "load" });
  // Mermaid renders after load; give each diagram time to become an SVG.
  const mermaidCount = await page.locator(".mermaid").count();
  if (mermaidCount > 0) {
    await page.waitForFunction(
      () => [...document.querySelectorAll(".mermaid")].every((e) => e.querySelector("svg")),
      null, { timeout: 20000 },
    ).catch(() => {});
  }
  const report = await page.evaluate((MIN_PX) => {
    const out = { diagrams: [], images: [], links: [] };
    document.querySelectorAll(".mermaid").forEach((e, i) => {
      const svg = e.querySelector("svg");
      const text = e.textContent ?? "";
      const bad = ["Syntax error", "Unsupported markdown", "Parse error"].find((t) => text.includes(t));
      const negative = svg ? [...svg.querySelectorAll("rect")].some((r) => parseFloat(r.getAttribute("width") ?? "0") < 0) : false;
      // A Gantt bar of zero width is a task that takes no time: a start/end mix-up.
      const emptyBar = svg ? [...svg.querySelectorAll("rect.task")].some((r) => parseFloat(r.getAttribute("width") ?? "0") <= 0) : false;
      // An axis whose tick labels repeat ("00 00 01 01") reads as nonsense.
      const ticks = svg ? [...svg.querySelectorAll("g.tick text")].map((t) => t.textContent) : [];
      const repeatedTicks = ticks.length > 1 && new Set(ticks).size < ticks.length;
      // Text drawn outside the diagram's own box is cut off on the page (e.g. a title
      // wider than the box around it).
      let clipped = null;
      if (svg) {
        const box = svg.getBoundingClientRect();
        for (const t of svg.querySelectorAll("text, foreignObject")) {
          const r = t.getBoundingClientRect();
          if (r.width === 0 || !(t.textContent ?? "").trim()) continue;
          if (r.left < box.left - 2 || r.right > box.right + 2 || r.top < box.top - 2 || r.bottom > box.bottom + 2) {
            clipped = (t.textContent ?? "").trim().slice(0, 40);
            break;
          }
        }
      }
      // A subgraph's title that wraps onto more lines than the layout left room for is
      // drawn under the boxes inside it: the title's box crosses a box that does not
      // contain it (its own frame and the frames around it contain it).
      let hiddenTitle = null;
      if (svg) {
        const boxes = [...svg.querySelectorAll("g.cluster > rect, g.node rect, g.node polygon, g.node circle, g.node path")]
          .map((r) => r.getBoundingClientRect());
        for (const label of svg.querySelectorAll("g.cluster-label")) {
          const l = label.getBoundingClientRect();
          const hit = boxes.some((b) => {
            const contains = b.left <= l.left + 1 && b.right >= l.right - 1 && b.top <= l.top + 1 && b.bottom >= l.bottom - 1;
            const crosses = Math.min(b.right, l.right) - Math.max(b.left, l.left) > 1 &&
                            Math.min(b.bottom, l.bottom) - Math.max(b.top, l.top) > 1;
            return crosses && !contains;
          });
          if (hit) { hiddenTitle = (label.textContent ?? "").trim().slice(0, 40); break; }
        }
      }
      out.diagrams.push({ i, svg: !!svg, bad: bad ?? null, negative, emptyBar,
                          repeatedTicks: repeatedTicks ? ticks.join(" ") : null, clipped, hiddenTitle });
    });
    document.querySelectorAll("img").forEach((img) => {
      out.images.push({ src: img.getAttribute("src"), ok: img.complete && img.naturalWidth > 0 });
    });
    // Links in the prose, and links in diagrams (mermaid's `click` writes xlink:href).
    const XLINK = "http://www.w3.org/1999/xlink";
    out.menuBar = document.querySelector(".right-buttons") !== null;
    out.languageSwitch = document.querySelector("a.language-switch")?.getAttribute("href") ?? null;
    document.querySelectorAll("#mdbook-content a, main a").forEach((a) => {
      const href = a.getAttribute("href") ?? a.getAttributeNS(XLINK, "href");
      if (href !== null && !out.links.includes(href)) out.links.push(href);
    });
    // SVG figures: the text each draws, at the size it is drawn on the page.
    out.figures = [];
    document.querySelectorAll("main img").forEach((img) => {
      const src = img.getAttribute("src") ?? "";
      if (/\.svg(?:$|[?#])/i.test(src)) out.figures.push({ src, url: img.src, width: img.getBoundingClientRect().width });
    });
    out.inlineSvgs = [];
    document.querySelectorAll("main svg").forEach((svg, i) => {
      if (svg.parentElement?.closest("svg")) return;
      const box = svg.getBoundingClientRect();
      if (box.width === 0) return;
      const diagram = svg.closest(".mermaid");
      const name = diagram
        ? `diagram ${[...document.querySelectorAll(".mermaid")].indexOf(diagram) + 1}`
        : `inline SVG ${i + 1}`;
      let smallest = null, small = 0;
      const consider = (el, px) => {
        const text = (el.textContent ?? "").trim();
        if (!text || el.getBoundingClientRect().width === 0) return;
        if (px < MIN_PX) small++;
        if (!smallest || px < smallest.px) smallest = { px, text: text.slice(0, 40) };
      };
      for (const t of svg.querySelectorAll("text")) {
        if (t.parentElement?.closest("text")) continue;
        const m = t.getScreenCTM();
        const scale = m ? Math.hypot(m.a, m.b) : 1;
        consider(t, parseFloat(getComputedStyle(t).fontSize) * scale);
      }
      for (const fo of svg.querySelectorAll("foreignObject")) {
        const m = fo.getScreenCTM();
        const scale = m ? Math.hypot(m.a, m.b) : 1;
        for (const el of fo.querySelectorAll("*")) {
          if (![...el.childNodes].some((c) => c.nodeType === 3 && c.textContent.trim())) continue;
          consider(el, parseFloat(getComputedStyle(el).fontSize) * scale);
        }
      }
      if (smallest && small > 0) out.inlineSvgs.push({ name, small, ...smallest });
    });
    return out;
  }, MIN_FIGURE_TEXT_PX);
  for (const d of report.diagrams) {
    diagrams++;
    if (!d.svg) problem(rel, `diagram ${d.i + 1} did not render`);
    if (d.bad) problem(rel, `diagram ${d.i + 1} shows "${d.bad}"`);
    if (d.negative) problem(rel, `diagram ${d.i + 1} has a bar of negative width`);
    if (d.emptyBar) problem(rel, `diagram ${d.i + 1} has a bar of zero width`);
    if (d.repeatedTicks) problem(rel, `diagram ${d.i + 1}'s axis repeats its labels: "${d.repeatedTicks}"`);
    if (d.clipped) problem(rel, `diagram ${d.i + 1} draws text outside its box: "${d.clipped}"`);
    if (d.hiddenTitle) problem(rel, `diagram ${d.i + 1}: the title "${d.hiddenTitle}" is drawn under other boxes`);
  }
  for (const img of report.images) if (!img.ok) problem(rel, `image ${img.src} did not load`);
  // The language switch leads to this page in the other edition (zh-CN/ beside the
  // English root), where there is one.
  if (hasEditions && report.menuBar) {
    const other = rel.startsWith("zh-CN/") ? rel.slice("zh-CN/".length) : `zh-CN/${rel}`;
    if (!report.languageSwitch) {
      problem(rel, "no language switch in the menu bar");
    } else {
      const url = new URL(report.languageSwitch, `${origin}/${rel}`);
      const target = decodeURIComponent(url.pathname).replace(/^\//, "");
      if (target !== other) problem(rel, `the language switch leads to ${target}, not ${other}`);
      else if ((await pageHtml(target)) === null) problem(rel, `the language switch leads to a missing ${target}`);
    }
  }
  for (const p of await page.evaluate(measurePres)) {
    if (p.wrap) problem(rel, `${where(p)} wraps its lines (white-space: ${p.wrap}): "${p.line}"`);
    if (p.scroll > 1) {
      problem(rel, `${where(p)} scrolls ${p.scroll} px sideways at 1280 px (${p.width} px wide); ` +
        `its longest line, ${p.longest} characters: "${p.line}"`);
    }
  }
  for (const f of report.figures) {
    const svg = await fetchSvgText(new URL(f.url).pathname);
    if (svg === null) continue; // the image check reports it
    const small = svgTextSizes(svg, f.width).filter((t) => t.px < MIN_FIGURE_TEXT_PX);
    if (small.length) {
      const least = small.reduce((a, b) => (b.px < a.px ? b : a));
      problem(rel, `figure ${f.src}: ${small.length} text element(s) under ${MIN_FIGURE_TEXT_PX} px ` +
        `as drawn ${Math.round(f.width)} px wide; the smallest, "${least.text}", at ${least.px.toFixed(1)} px ` +
        `(font-size ${least.size} in a ${least.viewWidth}-unit-wide viewBox)`);
    }
  }
  for (const d of report.inlineSvgs) {
    problem(rel, `${d.name}: ${d.small} text element(s) under ${MIN_FIGURE_TEXT_PX} px as drawn; ` +
      `the smallest, "${d.text}", at ${d.px.toFixed(1)} px`);
  }
  for (const href of report.links) {
    if (/^[a-z]+:/i.test(href) || href.startsWith("//")) continue; // external
    const url = new URL(href, `${origin}/${rel}`);
    const target = decodeURIComponent(url.pathname).replace(/^\//, "") || "index.html";
    const html = await pageHtml(target);
    if (html === null) { problem(rel, `broken link ${href}`); continue; }
    const anchor = url.hash.slice(1);
    if (anchor && !html.includes(`id="${decodeURIComponent(anchor)}"`)) {
      problem(rel, `link ${href}: no anchor #${anchor} on ${target}`);
    }
  }
  const shotName = rel.replaceAll("/", "_").replace(/\.html$/, "");
  await page.screenshot({ path: path.join(shotDir, `${shotName}.png`), fullPage: false });
  // Each diagram on its own, as drawn: what a reviewer looks at when a diagram changes.
  const drawn = page.locator(".mermaid");
  for (let i = 0; i < mermaidCount; i++) {
    await drawn.nth(i).screenshot({ path: path.join(shotDir, `${shotName}-diagram-${i + 1}.png`) }).catch(() => {});
  }
  await page.close();
}

// At a phone's width: no <pre> needs more than one screen of extra sideways scrolling.
// (Tables of outputs scroll in their own box; prose wraps.)
for (const rel of pages) {
  const page = await phone.newPage();
  await page.goto(`${origin}/${rel}`, { waitUntil: "load" });
  for (const p of await page.evaluate(measurePres)) {
    if (p.scrollWidth - p.width > PHONE_WIDTH) {
      problem(rel, `at ${PHONE_WIDTH} px, ${where(p)} is ${p.scrollWidth} px wide in a ${p.width} px box ` +
        `(more than a screen to scroll); its longest line, ${p.longest} characters: "${p.line}"`);
    }
  }
  const shotName = rel.replaceAll("/", "_").replace(/\.html$/, "");
  await page.screenshot({ path: path.join(shotDir, `${shotName}-phone.png`), fullPage: false });
  await page.close();
}

// Search: the reader's box finds the book's main subject, and its teasers are prose.
{
  const page = await context.newPage();
  await page.goto(`${origin}/index.html`, { waitUntil: "load" });
  await page.keyboard.press("s");
  const box = page.locator("input[type=search]").first();
  // mdBook loads its search index only when the box opens, and searches on keyup: a
  // key typed before the index arrived is not searched again. Type the term as a reader
  // would, then press a key that changes nothing until results appear (or 15 s pass).
  await box.pressSequentially("allocator");
  const results = page.locator("ul#mdbook-searchresults li, ul#searchresults li");
  for (let waited = 0; waited < 15000 && (await results.count()) === 0; waited += 250) {
    await page.waitForTimeout(250);
    await box.press("End");
  }
  const n = await results.count();
  if (n === 0) problem("search", 'searching "allocator" found nothing');
  const teasers = (await results.allTextContents()).join("\n");
  for (const word of ["flowchart", "sequenceDiagram", "gantt", "classDef", "-->"]) {
    if (teasers.includes(word)) problem("search", `a result's teaser shows diagram source ("${word}")`);
  }
  await page.screenshot({ path: path.join(shotDir, "search.png") });
  await page.close();
}

// The snapshot viewers (lab-03 view) the book embeds: each page loads, draws, and
// shows the peak that lab-03 summary reports for the same snapshot (its output file),
// and a hover on the timeline lists the allocations live at that moment.
const VIEWERS = [
  ["figures/lab-03/mlp-adam/view.html", "outputs/lab-03/summary-mlp.txt"],
  ["figures/lab-10/tutorial-view.html", "outputs/lab-10/tutorial-summary-gpu.txt"],
];
for (const [rel, summaryFile] of VIEWERS) {
  const page = await context.newPage();
  await page.goto(`${origin}/${rel}`, { waitUntil: "load" });
  const facts = (await page.locator("#facts").textContent()) ?? "";
  const shown = facts.match(/peak allocated ([\d.]+ [KMG]?i?B)/)?.[1];
  const summary = await readFile(path.join(bookDir, summaryFile), "utf8").catch(() => "");
  const native = summary.match(/peak requested over the trace\s*\|\s*([\d.]+ [KMG]?i?B)/)?.[1];
  if (!shown || !native || shown !== native) {
    problem(rel, `the viewer shows peak allocated ${shown ?? "(none)"}, lab-03 summary ${native ?? "(none)"}`);
  }
  const chart = await page.locator("canvas").boundingBox();
  if (chart) {
    await page.mouse.move(chart.x + chart.width / 2, chart.y + chart.height / 2);
    await page.waitForTimeout(200);
  }
  const rows = await page.locator("#side tr").count();
  if (!chart || rows < 2) problem(rel, `hovering the timeline listed ${rows} rows of live allocations`);
  await page.screenshot({ path: path.join(shotDir, rel.replaceAll("/", "_").replace(/\.html$/, ".png")) });
  await page.close();
}

// The interactions of a viewer page, timed in the page: zooming (the wheel, at points
// across the chart) and hovering (the readout of the moment under the cursor), each
// handled in full before the event returns. The slowest of each, in ms.
async function viewerTimings(page) {
  return page.evaluate(() => {
    const canvas = document.querySelector("canvas");
    const r = canvas.getBoundingClientRect();
    const at = (f) => ({ clientX: r.left + r.width * f, clientY: r.top + r.height / 2, bubbles: true, cancelable: true });
    let zoom = 0, hover = 0;
    for (let i = 0; i < 12; i++) {
      const f = 0.1 + 0.8 * (i / 11);
      let t = performance.now();
      canvas.dispatchEvent(new WheelEvent("wheel", { ...at(f), deltaY: i < 8 ? -120 : 120 }));
      zoom = Math.max(zoom, performance.now() - t);
      t = performance.now();
      canvas.dispatchEvent(new MouseEvent("mousemove", at(1 - f)));
      hover = Math.max(hover, performance.now() - t);
    }
    document.getElementById("reset").click();
    for (let i = 0; i < 20; i++) {
      const t = performance.now();
      canvas.dispatchEvent(new MouseEvent("mousemove", at(0.02 + 0.96 * (i / 19))));
      hover = Math.max(hover, performance.now() - t);
    }
    return { zoom, hover };
  });
}

// The snapshot viewer page (tools/viewer.html): a PyTorch snapshot chosen there becomes
// the page lab-03 view wrote for the same file (the book's figure), byte for byte; a
// file that is no snapshot is one line on the page, and the next file is read again.
{
  const rel = "tools/viewer.html";
  const page = await context.newPage();
  await page.goto(`${origin}/${rel}`, { waitUntil: "load" });
  const choose = async (file) => {
    const before = await page.evaluate(() => Number(document.getElementById("viewer-drop").dataset.done ?? 0));
    await page.setInputFiles("#viewer-file", file);
    await page.waitForFunction((b) => Number(document.getElementById("viewer-drop").dataset.done ?? 0) > b,
      before, { timeout: 60000 });
    return page.evaluate(() => ({
      error: document.getElementById("viewer-drop").dataset.error ?? null,
      srcdoc: document.getElementById("viewer-frame").getAttribute("srcdoc"),
    }));
  };
  const snapshot = path.resolve(bookDir, "../../data/snapshots/mlp_adam.pickle");
  const written = await readFile(path.join(bookDir, "figures/lab-03/mlp-adam/view.html"), "utf8");
  const made = await choose(snapshot);
  if (made.error || made.srcdoc !== written) {
    problem(rel, `mlp_adam.pickle made ${made.error ?? `a page of ${made.srcdoc?.length} characters`}, ` +
      `not the ${written.length} of lab-03 view's`);
  }
  const bad = await choose(path.resolve(bookDir, "../book.toml"));
  if (!bad.error || !bad.error.includes("not a memory snapshot") || bad.error.includes("\n")) {
    problem(rel, `a file that is no snapshot gave ${JSON.stringify(bad.error)}`);
  }
  const again = await choose(snapshot);
  if (again.error || again.srcdoc !== written) problem(rel, "after a bad file, a snapshot was not read again");
  await page.screenshot({ path: path.join(shotDir, "viewer-dropped.png"), fullPage: true });
  await page.close();
}

// A viewer of a 1 GB PyTorch snapshot ($BIG_VIEW, written by lab-03 view in .ci/run;
// $BIG_SUMMARY, lab-03 summary --json of the same file): its peak is the summary's, and
// each zoom and hover is answered within VIEW_LIMIT_MS.
const VIEW_LIMIT_MS = 100;
if (process.env.BIG_VIEW) {
  const rel = "the 1 GB snapshot's viewer";
  const page = await context.newPage();
  page.on("pageerror", (e) => problem(rel, `page error: ${e.message}`));
  const t = Date.now();
  await page.goto(`file://${path.resolve(process.env.BIG_VIEW)}`, { waitUntil: "load" });
  const loaded = Date.now() - t;
  const data = await page.evaluate(() => JSON.parse(document.getElementById("data").textContent));
  const summary = JSON.parse(await readFile(process.env.BIG_SUMMARY, "utf8"));
  if (data.peak.allocated !== summary.trace_peak_requested_bytes) {
    problem(rel, `peak ${data.peak.allocated} in the page, ${summary.trace_peak_requested_bytes} in lab-03 summary`);
  }
  const { zoom, hover } = await viewerTimings(page);
  console.log(`viewer of the 1 GB snapshot (${data.points - 1} events): loaded in ${loaded} ms; ` +
    `slowest zoom ${zoom.toFixed(1)} ms, slowest hover ${hover.toFixed(1)} ms`);
  if (zoom > VIEW_LIMIT_MS || hover > VIEW_LIMIT_MS) {
    problem(rel, `a zoom took ${zoom.toFixed(1)} ms and a hover ${hover.toFixed(1)} ms (limit ${VIEW_LIMIT_MS} ms)`);
  }
  await page.screenshot({ path: path.join(shotDir, "viewer-1gb.png") });
  await page.close();
}

// The calculator (tools/calculator.html: lab-10's dry run as WebAssembly): for every
// configuration `lab-10 configs` lists, a sweep of batch sizes, another allocator, a
// data-parallel run and a step that does not fit, the peaks the page shows equal those
// of `lab-10 --dry-run train --json` run here ($LAB10, the binary), to the byte. GPT-2
// small's answer comes within CALC_LIMIT_MS of the click; bad input is one line on the
// page, and the page answers again after it.
const CALC_LIMIT_MS = 2000;
{
  const rel = "tools/calculator.html";
  const lab10 = process.env.LAB10;
  const page = await context.newPage();
  const started = Date.now();
  await page.goto(`${origin}/${rel}`, { waitUntil: "load" });
  const answered = () => page.waitForFunction(
    () => document.getElementById("calculator")?.dataset.busy === "no" &&
      document.querySelector("#calc-result .calc-answer, #calc-result .calc-error"),
    null, { timeout: 60000 });
  await answered();
  console.log(`calculator: first answer ${Date.now() - started} ms after the page was asked for`);
  const ask = async (flags, capacity, workspace, alloc) => {
    await page.evaluate(([f, c, w, a]) => {
      const form = document.getElementById("calc-form");
      form.elements.flags.value = f;
      form.elements.capacity.value = c;
      form.elements.workspace.value = w;
      form.elements.alloc.value = a;
      document.getElementById("calc-result").replaceChildren();
    }, [flags, capacity, workspace, alloc]);
    const t = Date.now();
    await page.click("#calc-run");
    await answered();
    const ms = Date.now() - t;
    return {
      ms,
      ...(await page.evaluate(() => {
        const a = document.querySelector("#calc-result .calc-answer");
        const e = document.querySelector("#calc-result .calc-error");
        return a ? { allocated: a.dataset.peakAllocated, reserved: a.dataset.peakReserved, oom: a.dataset.oom === "oom" }
          : { error: e.textContent };
      })),
    };
  };
  const native = (flags, capacity, workspace, alloc) => {
    const args = ["--dry-run", "--capacity", capacity, ...(workspace ? ["--gemm-workspace", workspace] : []),
      "train", ...flags.split(/\s+/).filter(Boolean), "--json"];
    let out;
    try {
      out = execFileSync(lab10, args, { env: { ...process.env, LABS_ALLOC_CONF: alloc }, stdio: ["ignore", "pipe", "ignore"] });
    } catch (e) {
      out = e.stdout; // a run out of memory prints its report, then fails
    }
    const r = JSON.parse(String(out));
    return { allocated: String(r.peak_allocated), reserved: String(r.peak_reserved), oom: r.oom !== null };
  };
  if (!lab10 || !(await exists(lab10))) {
    problem(rel, "LAB10 names no lab-10 binary to compare the calculator with");
  } else {
    const cases = String(execFileSync(lab10, ["configs"])).trim().split("\n")
      .map((line) => line.split("\t")).map(([name, flags]) => ({ name, flags, capacity: "80GiB", workspace: "32MiB", alloc: "" }));
    for (const batch of [1, 2, 4, 16]) {
      cases.push({ name: `gpt2 batch ${batch}`, flags: `--model gpt2 --batch ${batch}`, capacity: "80GiB", workspace: "32MiB", alloc: "" });
    }
    for (const batch of [8, 32, 128, 256]) {
      cases.push({ name: `transformer batch ${batch}`, flags: `--model transformer --d-model 256 --seq 100 --batch ${batch}`, capacity: "24GiB", workspace: "", alloc: "" });
    }
    cases.push({ name: "max_split_size_mb", flags: "--model gpt2 --batch 4 --amp bf16", capacity: "80GiB", workspace: "32MiB", alloc: "max_split_size_mb:128" });
    cases.push({ name: "roundup_power2_divisions", flags: "--model gpt2 --batch 4 --checkpoint layers", capacity: "80GiB", workspace: "32MiB", alloc: "roundup_power2_divisions:4" });
    cases.push({ name: "zero1 on 2", flags: "--model gpt2 --layers 4 --batch 4 --nproc 2 --zero1", capacity: "80GiB", workspace: "32MiB", alloc: "" });
    cases.push({ name: "does not fit", flags: "--model gpt2 --batch 16", capacity: "4GiB", workspace: "32MiB", alloc: "", oom: true });
    let slowest = 0;
    for (const c of cases) {
      const got = await ask(c.flags, c.capacity, c.workspace, c.alloc);
      const want = native(c.flags, c.capacity, c.workspace, c.alloc);
      if (got.error || got.allocated !== want.allocated || got.reserved !== want.reserved || got.oom !== want.oom) {
        problem(rel, `${c.name} (${c.flags}, ${c.capacity}): the page says ${JSON.stringify(got)}, lab-10 ${JSON.stringify(want)}`);
      }
      if (Boolean(c.oom) !== want.oom) problem(rel, `${c.name}: expected ${c.oom ? "an" : "no"} out-of-memory error`);
      if (c.flags === "--model gpt2 --batch 8" || c.name === "gpt2-none") slowest = Math.max(slowest, got.ms);
    }
    console.log(`calculator: ${cases.length} configurations equal to lab-10's dry run; GPT-2 small answered in ${slowest} ms`);
    if (slowest > CALC_LIMIT_MS) problem(rel, `GPT-2 small took ${slowest} ms to answer (limit ${CALC_LIMIT_MS} ms)`);
    await page.screenshot({ path: path.join(shotDir, "calculator-oom.png"), fullPage: true });
  }
  for (const [flags, capacity, says, alloc] of [
    ["--model gpt3", "80GiB", "gpt3"],
    ["--model gpt2 --nhead 5", "80GiB", "nhead"],
    ["--model gpt2", "lots", "memory"],
    // GPT-2's logits at batch 32 x 1024 take 6.6 GB: more than 32-bit WebAssembly holds.
    ["--model gpt2 --batch 32", "80GiB", "32-bit WebAssembly"],
    ["--model gpt2 --batch 1", "80GiB", "expandable segments", "expandable_segments:True"],
  ]) {
    const got = await ask(flags, capacity, "", alloc ?? "");
    if (!got.error || !got.error.includes(says) || got.error.includes("\n")) {
      problem(rel, `${flags} with ${capacity}: expected a one-line error naming "${says}", got ${JSON.stringify(got)}`);
    }
  }
  const after = await ask("--model gpt2 --layers 2 --batch 1", "80GiB", "", "");
  if (!after.allocated) problem(rel, `after the bad requests the page does not answer: ${JSON.stringify(after)}`);
  await page.evaluate(() => { document.getElementById("calc-form").elements.fit.checked = true; });
  const fitted = await ask("--model gpt2 --batch 8", "80GiB", "32MiB", "");
  const fitBatch = await page.locator("[data-fit-batch]").getAttribute("data-fit-batch").catch(() => null);
  if (fitted.error || !(Number(fitBatch) > 8)) problem(rel, `the fit search gave ${fitBatch} (${JSON.stringify(fitted)})`);
  await page.screenshot({ path: path.join(shotDir, "calculator-answer.png"), fullPage: true });
  await page.close();
}

await browser.close();
server.close();
console.log(`book browser test: ${pages.length} pages, ${diagrams} diagrams, ${problems.length} problems`);
for (const p of problems) console.log(`  ${p}`);
process.exit(problems.length === 0 ? 0 : 1);
