// Loads the shoal dashboard in headless Chromium (Debian's /usr/bin/chromium,
// driven by playwright-core) against a running server and checks what it
// draws.  Usage: node dashboard.mjs URL TOKEN SCREENSHOT.png EXPECT.json
// EXPECT: {"nodes": [names], "dead": [names], "running": {"id", "name"},
//          "queued": id, "tenant": name, "gpu_type": type, "submit": JOB}
// Exits 0 when every check passed; prints the failed check otherwise.
import { chromium } from "playwright-core";
import { readFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, token, shotdir, expectPath] = process.argv.slice(2);
const want = JSON.parse(readFileSync(expectPath, "utf8"));
const fail = msg => { console.error("dashboard check failed: " + msg); process.exitCode = 1; };

// A fresh profile each run (playwright passes it as --user-data-dir).
const browser = await chromium.launchPersistentContext(mkdtempSync(join(tmpdir(), "shoal-chromium-")), {
  executablePath: "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1400, height: 900 },
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", e => errors.push(e.message));
  await page.goto(`${url}/#token=${encodeURIComponent(token)}`);
  await page.waitForSelector("body[data-loaded='1']", { timeout: 10000 });
  // The token leaves the address (and so the browser's history) at once.
  if (page.url().includes(encodeURIComponent(token)) || page.url().includes("token="))
    fail(`the token stays in the address: ${page.url()}`);

  // The fleet: every node drawn once, inside its zone and pool.
  const names = await page.$$eval("#fleet .node", els => els.map(e => e.dataset.name));
  for (const n of want.nodes) if (!names.includes(n)) fail(`node ${n} is not drawn (drawn: ${names})`);
  if (names.length !== want.nodes.length) fail(`${names.length} nodes drawn, expected ${want.nodes.length}`);
  for (const n of want.dead || []) {
    const cls = await page.getAttribute(`#fleet .node[data-name='${n}']`, "class");
    if (!cls || !cls.includes("dead")) fail(`node ${n} is not drawn as dead`);
  }
  const zones = await page.$$eval("#fleet .zone", els => els.map(e => e.dataset.zone));
  for (const z of want.zones || []) if (!zones.includes(z)) fail(`zone ${z} missing (zones: ${zones})`);

  // A running gang, with its ranks on nodes, and its GPUs drawn busy.
  const gang = `#gangs tr[data-job='${want.running.id}']`;
  await page.waitForSelector(gang, { timeout: 10000 });
  const row = await page.textContent(gang);
  if (!row.includes(want.running.name) || !row.includes("running")) fail(`gang row reads "${row}"`);
  // ... and when the scheduler plans it to end.
  const ends = await page.textContent(`${gang} td.ends`);
  if (!/^(in \S|due now)/.test(ends)) fail(`running gang's planned end reads "${ends}"`);
  const busy = await page.$$eval("#fleet .gpu.busy", els => els.length);
  if (busy < want.running.gpus) fail(`${busy} GPUs drawn busy, expected at least ${want.running.gpus}`);

  // The queue and the costs.
  await page.waitForSelector(`#queue tr[data-job='${want.queued}']`, { timeout: 10000 });
  // Every pending job says why it waits and when it should start.
  const why = await page.textContent(`#queue tr[data-job='${want.queued}'] td.reason`);
  const wait = await page.getAttribute(`#queue tr[data-job='${want.queued}'] td.reason`, "data-wait");
  const starts = await page.textContent(`#queue tr[data-job='${want.queued}'] td.start`);
  if (!wait || !why || why.length < 10) fail(`queued job's reason reads "${why}" (wait "${wait}")`);
  if (!starts) fail("queued job has no start estimate cell");
  await page.waitForSelector(`#costs tr[data-tenant='${want.tenant}'][data-type='${want.gpu_type}']`, { timeout: 10000 });

  // Live refresh: a job submitted now appears without reloading the page.
  const id = await page.evaluate(async ([tok, job]) => {
    const r = await fetch("/v1/jobs", { method: "POST", headers: { Authorization: "Bearer " + tok }, body: JSON.stringify(job) });
    return (await r.json()).id;
  }, [token, want.submit]);
  await page.waitForSelector(`#gangs tr[data-job='${id}'], #queue tr[data-job='${id}']`, { timeout: 10000 });

  // Heartbeat age on every node: recent on alive nodes, stale on the dead one.
  for (const n of want.nodes) {
    const age = Number(await page.getAttribute(`#fleet .node[data-name='${n}'] .hb`, "data-age"));
    const dead = (want.dead || []).includes(n);
    if (!dead && !(age >= 0 && age < 3)) fail(`node ${n}: heartbeat age ${age} on an alive node`);
    if (dead && !(age > 3)) fail(`node ${n}: heartbeat age ${age} on a dead node`);
  }
  if (errors.length) fail("page errors: " + errors.join("; "));
  await page.screenshot({ path: join(shotdir, "dashboard.png"), fullPage: true });

  // A job's detail view, opened by clicking its row: events and log tail.
  await page.click(gang);
  await page.waitForSelector(`#detail[data-job='${want.running.id}']`, { timeout: 10000 });
  for (const kind of ["submitted", "placed", "running"])
    if (!(await page.$(`#d-events tr[data-kind='${kind}']`))) {
      const kinds = await page.$$eval("#d-events tr", els => els.map(e => e.dataset.kind));
      fail(`detail view lacks the "${kind}" event (events: ${kinds})`);
    }
  await page.waitForFunction(w => document.getElementById("d-log").textContent.includes(w), want.running.log,
                             { timeout: 10000 }).catch(() => {});
  const log = await page.textContent("#d-log");
  if (!log.includes(want.running.log)) fail(`detail view's log tail lacks "${want.running.log}": ${log}`);
  await page.screenshot({ path: join(shotdir, "dashboard-job.png"), fullPage: true });

  // 800 px: nothing runs off the page (tables scroll inside their boxes).
  await page.setViewportSize({ width: 800, height: 900 });
  await page.goto(`${url}/?token=${encodeURIComponent(token)}`);
  await page.waitForSelector("body[data-loaded='1']", { timeout: 10000 });
  if (page.url().includes("token=")) fail(`an older ?token= link stays in the address: ${page.url()}`);
  const wide = await page.evaluate(() => document.documentElement.scrollWidth);
  if (wide > 800) fail(`at 800 px the page is ${wide} px wide`);
  await page.screenshot({ path: join(shotdir, "dashboard-800.png"), fullPage: true });
  console.log(`dashboard ok: ${names.length} nodes, gang ${want.running.id}, queued ${want.queued}, live job ${id}`);
} catch (e) {
  fail(e.message);
} finally {
  await browser.close();
}
