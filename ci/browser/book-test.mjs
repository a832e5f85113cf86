// Loads every page of the built book in headless Chromium, as a reader would, and fails
// on what a reader would see broken:
//   - an error in the browser console, or an uncaught exception on the page;
//   - a mermaid diagram that did not become an SVG, or that shows mermaid's error text
//     ("Syntax error", "Unsupported markdown"); a Gantt bar of zero or negative width, or
//     an axis whose labels repeat; text drawn outside the diagram, or a subgraph title
//     hidden under the boxes inside it;
//   - a link to a page of the book that does not exist, or to an anchor that is not on
//     its page; an image that did not load;
//   - a text or JSON output, or a shell listing, that runs off the right edge instead
//     of wrapping;
//   - a search that finds nothing, or whose teasers show diagram source.
// A screenshot of every page, and of every diagram, goes to the screenshots folder.
//
// Usage: node book-test.mjs BOOK_DIR SCREENSHOT_DIR   (Chromium: $CHROMIUM or /usr/bin/chromium)

import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { readFile, readdir, mkdir, stat } from "node:fs/promises";
import path from "node:path";

const bookDir = path.resolve(process.argv[2] ?? "book/book");
const shotDir = path.resolve(process.argv[3] ?? "ci/browser/screenshots");
const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";

const TYPES = {
  ".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript",
  ".css": "text/css", ".svg": "image/svg+xml", ".png": "image/png", ".json": "application/json",
  ".woff": "font/woff", ".woff2": "font/woff2", ".ttf": "font/ttf", ".txt": "text/plain",
  ".ico": "image/x-icon",
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

// Every page but the one-page print version (the same content, checked page by page).
const pages = (await htmlPages(bookDir))
  .map((f) => path.relative(bookDir, f))
  .filter((f) => f !== "print.html" && f !== "toc.html")
  .sort();
const htmlCache = new Map();
async function pageHtml(rel) {
  if (!htmlCache.has(rel)) {
    const file = path.join(bookDir, rel);
    htmlCache.set(rel, (await exists(file)) ? await readFile(file, "utf8") : null);
  }
  return htmlCache.get(rel);
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
  const report = await page.evaluate(() => {
    const out = { diagrams: [], images: [], links: [], overflow: [] };
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
    document.querySelectorAll("#mdbook-content a, main a").forEach((a) => {
      const href = a.getAttribute("href") ?? a.getAttributeNS(XLINK, "href");
      if (href !== null && !out.links.includes(href)) out.links.push(href);
    });
    // mdBook's highlighter makes the <code> element itself the scrolling box
    // (.hljs { overflow-x: auto }), so both it and its <pre> are measured.
    document.querySelectorAll("pre > code.language-text, pre > code.language-json, pre > code.language-sh").forEach((c) => {
      const pre = c.parentElement;
      if (pre.scrollWidth > pre.clientWidth + 2 || c.scrollWidth > c.clientWidth + 2) {
        out.overflow.push((c.textContent ?? "").split("\n").find((l) => l.length > 90)?.slice(0, 60) ?? "");
      }
    });
    return out;
  });
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
  for (const line of report.overflow) problem(rel, `an output runs off the right edge: "${line}…"`);
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

await browser.close();
server.close();
console.log(`book browser test: ${pages.length} pages, ${diagrams} diagrams, ${problems.length} problems`);
for (const p of problems) console.log(`  ${p}`);
process.exit(problems.length === 0 ? 0 : 1);
