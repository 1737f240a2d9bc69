// Opens the main job's report (build/mainrun/report.html) in headless
// Chromium (Debian's /usr/bin/chromium via playwright-core), checks what it
// shows, and writes a full-page screenshot.
// Usage: node report.mjs REPORT.html SCREENSHOT.png
// Checks: no script errors; the plots (reward against wall-clock time and
// against cost, cost by GPU type, bytes moved) are drawn with data; the
// fleet-cost table has the uniform, mixed and tuned pools with costs.
// Exits 0 when every check passed; prints the failed check otherwise.
import { chromium } from "playwright-core";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const [report, shot] = process.argv.slice(2);
const fail = msg => { console.error("report check failed: " + msg); process.exitCode = 1; };

const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "shoal-chromium-")), {
  executablePath: "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1200, height: 900 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", e => errors.push(e.message));
  await page.goto("file://" + resolve(report));
  const titles = await page.$$eval("svg", els => els.map(e => e.textContent));
  for (const t of ["Reward against wall-clock time", "Reward against cost", "Cost by GPU type", "Bytes per worker",
                   "Fleet cost"])
    if (!titles.some(x => x.includes(t))) fail(`no plot titled "${t}" (plots: ${titles.length})`);
  const drawn = await page.$$eval("svg polyline, svg rect", els => els.length);
  if (drawn < 6) fail(`only ${drawn} lines and bars drawn`);
  const rows = await page.$$eval("table tr", els => els.map(e => e.textContent));
  for (const p of ["uniform", "mixed", "tuned"])
    if (!rows.some(r => r.startsWith(p) && r.includes("x"))) fail(`fleet-cost table has no ${p} row`);
  const text = await page.textContent("body");
  if (!/mixed saving[^:]*: *-?\d+\.\d%/.test(text)) fail("no mixed saving in the text");
  if (errors.length) fail("script errors: " + errors.join("; "));
  await page.screenshot({ path: shot, fullPage: true });
} finally {
  await browser.close();
}
