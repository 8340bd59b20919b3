// Loads an idem status page in headless Chromium and checks it as a person
// would see it: the chart draws lines from the traffic the caller sends,
// the tables fill, no error reaches the console, and no request leaves the
// server the page came from. Writes a screenshot.
//
// node status_page.mjs URL SCREENSHOT_PATH [NAMESPACE]
// With IDEM_STATUS_TOKEN set, the page must ask for a token first; the
// script gives it this one.
// Prints one JSON line; exits 1 on any failure.
import { chromium } from "playwright-core";

const [url, screenshot, namespace = "orders"] = process.argv.slice(2);
if (!url || !screenshot) {
  console.error("usage: node status_page.mjs URL SCREENSHOT_PATH [NAMESPACE]");
  process.exit(2);
}

const browser = await chromium.launch({
  executablePath: process.env.IDEM_CHROMIUM || "/usr/bin/chromium",
  args: ["--headless=new", "--no-sandbox", "--disable-gpu"],
});
const problems = [];
try {
  const page = await browser.newPage({ viewport: { width: 1200, height: 1000 } });
  // Until it has a token, the page's requests for the status are refused
  // (401), which Chromium reports on the console; nothing else may be. (A
  // refusal after the token was given shows in what the page draws.)
  const refusalExpected = Boolean(process.env.IDEM_STATUS_TOKEN);
  page.on("console", (m) => {
    if (refusalExpected && m.text().includes("status of 401")) return;
    if (m.type() === "error" || m.type() === "warning") problems.push(`console ${m.type()}: ${m.text()}`);
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
  const origin = new URL(url).origin;
  page.on("request", (r) => {
    if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) problems.push(`request elsewhere: ${r.url()}`);
  });

  const response = await page.goto(url, { waitUntil: "load" });
  if (!response || response.status() !== 200) throw new Error(`GET ${url}: ${response?.status()}`);

  // With IDEM_STATUS_TOKEN, the server asks for a token: the page shows its
  // form and nothing else until it has one.
  const token = process.env.IDEM_STATUS_TOKEN;
  let beforeToken = null;
  if (token) {
    await page.waitForSelector("#token-form:not([hidden])", { timeout: 15000 });
    beforeToken = await page.evaluate(() => ({
      namespaces: [...document.querySelectorAll("#namespaces tbody tr")].map((tr) => tr.cells[0].textContent),
    }));
    await page.fill("#token", token);
    await page.click("#token-form button[type=submit]");
    await page.waitForSelector("#token-form", { state: "hidden", timeout: 15000 });
  }

  // The chart has drawn at least one line with a point above zero.
  await page.waitForFunction(
    () => {
      const chart = document.getElementById("chart");
      return Number(chart.dataset.max) > 0 && chart.querySelectorAll("polyline.series").length > 0;
    },
    null,
    { timeout: 30000 },
  );
  // The namespace is in the table, and choosing it charts it alone.
  await page.waitForFunction(
    (ns) => [...document.querySelectorAll("#namespaces tbody td:first-child")].some((td) => td.textContent === ns),
    namespace,
    { timeout: 15000 },
  );
  await page.selectOption("#namespace", namespace);
  await page.waitForFunction(() => Number(document.getElementById("chart").dataset.max) > 0, null, { timeout: 15000 });
  // Hovering the chart shows the figures at that moment.
  const box = await page.locator("#chart").boundingBox();
  await page.mouse.move(box.x + box.width - 20, box.y + box.height / 2);
  await page.waitForSelector("#tooltip:not([hidden])", { timeout: 5000 });

  const seen = await page.evaluate(() => ({
    title: document.title,
    health: document.getElementById("health").textContent,
    healthy: document.getElementById("health").classList.contains("ok"),
    lines: [...document.querySelectorAll("#chart polyline.series")].map((p) => p.dataset.outcome),
    max: Number(document.getElementById("chart").dataset.max),
    namespaces: [...document.querySelectorAll("#namespaces tbody tr")].map((tr) => [...tr.cells].map((c) => c.textContent)),
    stuck: [...document.querySelectorAll("#stuck tbody tr")].map((tr) => [...tr.cells].map((c) => c.textContent)),
    findings: document.querySelectorAll("#findings li").length,
    banner: !document.getElementById("unreachable").hidden,
  }));
  await page.mouse.move(0, 0);
  await page.screenshot({ path: screenshot, fullPage: true });
  if (!seen.healthy) problems.push(`the store shows as unhealthy: ${seen.health}`);
  if (seen.banner) problems.push("the page says it cannot reach idem");
  console.log(JSON.stringify({ ok: problems.length === 0, problems, seen, asked_for_token: token ? true : undefined, before_token: beforeToken }));
} catch (e) {
  problems.push(String(e && e.stack ? e.stack : e));
  console.log(JSON.stringify({ ok: false, problems }));
} finally {
  await browser.close();
}
process.exit(problems.length === 0 ? 0 : 1);
