import { chromium } from "playwright-core";
import { createServer } from "node:http";
import { readFile } from "node:fs/promises";
import path from "node:path";
const root = process.argv[2];
const types = { ".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml", ".wasm": "application/wasm", ".woff2": "font/woff2" };
const server = createServer(async (req, res) => {
  const p = path.join(root, decodeURIComponent(new URL(req.url, "http://x").pathname));
  try { const b = await readFile(p); res.writeHead(200, { "content-type": types[path.extname(p)] ?? "application/octet-stream" }); res.end(b); }
  catch { res.writeHead(404); res.end(); }
});
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
page.on("console", (m) => console.log("console:", m.text()));
page.on("pageerror", (e) => console.log("pageerror:", e.message));
const t = Date.now();
await page.goto(`http://127.0.0.1:${server.address().port}/tools/calculator.html`, { waitUntil: "load" });
await page.waitForSelector("#calc-result .calc-answer, #calc-result .calc-error", { timeout: 20000 });
console.log("first answer after", Date.now() - t, "ms");
console.log(await page.locator("#calc-result .calc-answer").evaluate((e) => [e.dataset.peakAllocated, e.dataset.peakReserved]).catch(() => "none"));
console.log(await page.locator("#calc-result").innerText().then((s) => s.slice(0, 500)));
await page.screenshot({ path: "/tmp/calc1.png", fullPage: true });
await browser.close();
server.close();
