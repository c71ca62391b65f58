// Drives the console of a two-node cluster in Debian's headless Chromium,
// logged in to node A (crates/wasmkeep/tests/console.rs starts both nodes,
// gives B an actor with an alarm, and runs this): the overview draws a line
// per node, the cluster page counts each node's holds, the alarm page lists
// B's alarm with B's name, and the actor's live log shows the lines B
// wrote, a new one included. Exits non-zero, naming the step, on the first
// thing that is not as an operator would expect.
//
// Input (environment): CONSOLE_TEST, a JSON object with
//   base      node A's address (the console the browser opens)
//   b_base    node B's address (where the test sends the actor's requests)
//   token     both nodes' admin token
//   b_node    node B's name
//   actor     a reminder actor B holds, with an alarm far ahead
//   shots     a folder for screenshots (cluster-*.png), or null
//   chromium  the browser's path
import { chromium } from 'playwright-core';

const t = JSON.parse(process.env.CONSOLE_TEST);
const STEP_MS = 15000;
let step = 'start';
const failures = [];

function check(ok, what) {
  if (!ok) failures.push(step + ': ' + what);
}

async function shot(page, name) {
  if (t.shots) await page.screenshot({ path: t.shots + '/cluster-' + name + '.png', fullPage: true });
}

const browser = await chromium.launch({ executablePath: t.chromium, args: ['--no-sandbox'] });
try {
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  page.setDefaultTimeout(STEP_MS);
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));

  step = 'log in to A';
  await page.goto(t.base + '/console');
  await page.fill('#token', t.token);
  await page.click('#login button[type=submit]');
  await page.waitForSelector('h1:text("Overview")');

  step = 'the overview shows both nodes';
  await page.waitForSelector('.stat:has-text("nodes live")');
  check((await page.textContent('.stat:has-text("nodes live") b')) === '2', 'two nodes live');
  const legends = await page.$$eval('figure.card:first-of-type .legend', (ls) => ls.map((l) => l.title));
  check(legends.length === 2 && legends.includes(t.b_node), 'a line per node in the first chart: ' + legends.join(' | '));
  check((await page.$$('figure.card:first-of-type svg path')).length === 2, 'two paths in the first chart');
  await shot(page, 'overview');

  step = 'the cluster page counts every node\'s holds';
  await page.click('nav a[href="#/cluster"]');
  await page.waitForSelector('h1:text("Cluster")');
  const rowB = await page.textContent(`tr:has(td:text-is("${t.b_node}"))`);
  check(/\d+ actors/.test(rowB) && !rowB.includes('did not answer'), 'B answers its holds: ' + rowB);
  check(!(await page.textContent('main')).includes('did not answer'), 'every node answered');
  await shot(page, 'nodes');

  step = 'the alarm page lists B\'s alarm';
  await page.click('nav a[href="#/alarms"]');
  await page.waitForSelector('h2:text("Pending on every live node")');
  const link = `a[href="#/actor/demo/examples/reminder/${encodeURIComponent(t.actor)}"]`;
  const alarmRow = await page.textContent(`tr:has(${link})`);
  check(alarmRow.includes(t.b_node), 'the row names B: ' + alarmRow);
  await shot(page, 'alarms');

  step = 'the actor\'s live log shows B\'s lines';
  await page.click(link);
  await page.waitForSelector('#live-log');
  await page.waitForFunction((n) => document.getElementById('live-log').textContent.includes('[' + n + ']'), t.b_node);
  const sets = () => page.$$eval('#live-log li', (ls) => ls.filter((l) => l.textContent.includes('/set')).length);
  const before = await sets();
  check(before >= 1, 'the request that set the alarm is in the log');
  // Access lines name no query: a new line is told by the count.
  const r = await fetch(t.b_base + '/v1/demo/examples/reminder/' + encodeURIComponent(t.actor) + '/set?at_ms=9999999999998', {
    method: 'POST',
    headers: { authorization: 'Bearer ' + t.token },
  });
  check(r.status === 200, 'B ran a new request (status ' + r.status + ')');
  await page.waitForFunction((n) => [...document.querySelectorAll('#live-log li')].filter((l) => l.textContent.includes('/set')).length > n, before);

  check(pageErrors.length === 0, 'no script error: ' + pageErrors.join(' | '));
} catch (e) {
  failures.push(step + ': ' + e.message.split('\n')[0]);
  for (const p of browser.contexts().flatMap((c) => c.pages())) {
    failures.push('page ' + p.url() + ' shows: ' + (await p.textContent('main').catch(() => '?')).slice(0, 400));
    failures.push('its log: ' + (await p.textContent('#live-log').catch(() => '?')).slice(0, 600));
  }
} finally {
  await browser.close();
}
if (failures.length) {
  console.error('console test failed:\n- ' + failures.join('\n- '));
  process.exit(1);
}
console.log('console test passed');
