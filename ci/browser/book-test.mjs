// Loads every page of the built book in headless Chromium, as a reader would, and fails
// on what a reader would see broken:
//   - an error in the browser console, or an uncaught exception on the page;
//   - a mermaid diagram that did not become an SVG, or that shows mermaid's error text
//     ("Syntax error", "Unsupported markdown");
//   - a link to a page of the book that does not exist, or to an anchor that is not on
//     its page; an image that did not load;
//   - a text or JSON output that runs off the right edge instead of wrapping;
//   - a search that finds nothing, or whose teasers show diagram source.
// A screenshot of every page goes to the screenshots folder.
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
      out.diagrams.push({ i, svg: !!svg, bad: bad ?? null, negative });
    });
    document.querySelectorAll("img").forEach((img) => {
      out.images.push({ src: img.getAttribute("src"), ok: img.complete && img.naturalWidth > 0 });
    });
    document.querySelectorAll("#mdbook-content a[href], main a[href]").forEach((a) => {
      out.links.push(a.getAttribute("href"));
    });
    document.querySelectorAll("pre > code.language-text, pre > code.language-json").forEach((c) => {
      const pre = c.parentElement;
      if (pre.scrollWidth > pre.clientWidth + 2) {
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
  await page.screenshot({ path: path.join(shotDir, rel.replaceAll("/", "_").replace(/\.html$/, ".png")), fullPage: false });
  await page.close();
}

// Search: the reader's box finds the book's main subject, and its teasers are prose.
{
  const page = await context.newPage();
  await page.goto(`${origin}/index.html`, { waitUntil: "load" });
  await page.keyboard.press("s");
  const box = page.locator("input[type=search]").first();
  await box.fill("allocator");
  await page.waitForTimeout(1500);
  const results = page.locator("ul#mdbook-searchresults li, ul#searchresults li");
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
