// Drives the console in Debian's headless Chromium as an operator would
// (crates/wasmkeep/tests/console.rs starts the node, fills it, and runs
// this). Exits non-zero, naming the step, on the first thing that is not
// as an operator would expect.
//
// Input (environment): CONSOLE_TEST, a JSON object with
//   base        the node's address, http://127.0.0.1:PORT
//   token       its admin token
//   hostile     an actor name (class `notes`) that is HTML, holding a KV value that is HTML too
//   kv_value    that KV value
//   note_title  the title of a note that actor holds (found by the SQL step)
//   pinger      a pinger actor whose live log the test watches
//   reminder    a reminder actor with an alarm set through the API
//   doomed      a notes actor the test deletes through the console
//   timers      a timers actor with one named timer, named `timer` (HTML too)
//   shots       a folder for screenshots, or null
//   chromium    the browser's path
import { chromium } from 'playwright-core';

const t = JSON.parse(process.env.CONSOLE_TEST);
const STEP_MS = 15000;
let step = 'start';
const failures = [];

function check(ok, what) {
  if (!ok) failures.push(step + ': ' + what);
}

async function shot(page, name) {
  if (t.shots) await page.screenshot({ path: t.shots + '/' + name + '.png', fullPage: true });
}

const seg = encodeURIComponent;

const browser = await chromium.launch({ executablePath: t.chromium, args: ['--no-sandbox'] });
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(STEP_MS);
  const dialogs = [];
  page.on('dialog', async (d) => {
    dialogs.push(d.type() + ': ' + d.message());
    // Only the console's own confirmations are expected; an alert would be
    // hostile text that ran.
    if (d.type() === 'confirm') await d.accept(); else await d.dismiss();
  });
  const pageErrors = [];
  page.on('pageerror', (e) => pageErrors.push(String(e)));

  step = 'log in with a wrong token';
  await page.goto(t.base + '/console');
  await page.fill('#token', 'not-the-token');
  await page.click('#login button[type=submit]');
  await page.waitForSelector('#login-status .error');
  check((await page.textContent('#login-status code')) === 'unauthorized', 'a wrong token is refused with its code');

  step = 'log in';
  await page.fill('#token', t.token);
  await shot(page, 'login');
  await page.click('#login button[type=submit]');
  await page.waitForSelector('h1:text("Overview")');
  await page.waitForSelector('figure.card');
  await shot(page, 'overview');

  step = 'see the deployed app';
  await page.click('nav a[href="#/apps"]');
  await page.waitForSelector('a[href="#/app/demo/examples"]');
  await shot(page, 'apps');
  await page.click('a[href="#/app/demo/examples"]');
  await page.waitForSelector('h2:text("Versions")');
  check((await page.textContent('main')).includes('notes'), 'the app page lists its classes');

  step = 'find the hostile actor by prefix';
  await page.click('a[href="#/class/demo/examples/notes"]');
  await page.waitForSelector('#prefix');
  await page.fill('#prefix', t.hostile.slice(0, 4));
  await page.click('form.inline button[type=submit]');
  const actorLink = '#/actor/demo/examples/notes/' + seg(t.hostile);
  // The unfiltered page lists the actor too: wait for the filtered one
  // (its count), not just for the link.
  await page
    .waitForFunction(() => /: 1$/.test(document.querySelector('#actor-count')?.textContent ?? ''), null, { timeout: 10000 })
    .catch(() => {});
  await page.waitForSelector(`a[href="${actorLink}"]`);
  check((await page.textContent(`a[href="${actorLink}"]`)) === t.hostile, 'the actor name shows as its text');
  check(!(await page.textContent('main')).includes(t.doomed), 'the prefix leaves other actors out');
  check(/: 1$/.test(await page.textContent('#actor-count')), 'the count says one actor has that prefix');
  await shot(page, 'actors');

  step = 'open the actor';
  await page.click(`a[href="${actorLink}"]`);
  await page.waitForSelector('#kv table');
  check((await page.textContent('#actor-name')) === t.hostile, 'the title holds the name as text');
  check((await page.textContent('#kv')).includes(t.kv_value), 'the KV browser shows the value as text');
  check((await page.$$('main img, main script, main iframe')).length === 0, 'no element came from hostile text');
  check(await page.evaluate(() => window.pwned === undefined), 'no hostile script ran');

  step = 'run a SQL query';
  await page.fill('#sql', 'SELECT title FROM notes ORDER BY id');
  await page.click('#run-sql');
  await page.waitForSelector('#sql-result table');
  check((await page.textContent('#sql-result')).includes(t.note_title), 'the result grid shows the row');
  await page.fill('#sql', 'DELETE FROM notes');
  await page.click('#run-sql');
  await page.waitForSelector('#sql-result .error');
  check((await page.textContent('#sql-result')).length > 0, 'a write is refused with an error');

  step = 'browse a table';
  await page.click('#tables button:text-is("notes")');
  await page.waitForSelector('#table-browser table');
  check((await page.textContent('#table-browser')).includes(t.note_title), 'the table browser shows the rows');
  await shot(page, 'actor');

  step = 'open a trace of the actor';
  // The request that wrote the note (its statements are spans).
  const writeTrace = '#actor-traces tr:has-text("POST") a[href^="#/trace/"]';
  await page.waitForSelector(writeTrace);
  await page.click(writeTrace);
  await page.waitForSelector('#timeline');
  for (const name of ['request', 'queue', 'guest', 'sql', 'commit', 'durable']) {
    check((await page.$$(`#timeline tr[data-span="${name}"]`)).length > 0, 'the timeline has a ' + name + ' span');
  }
  await shot(page, 'trace');

  step = 'watch a log line arrive';
  await page.goto(t.base + '/console#/actor/demo/examples/pinger/' + seg(t.pinger));
  await page.waitForSelector('#live-log');
  const marker = '<script>window.pwned=2</script>' + Date.now();
  // The live log is open once its first lines (or none) have come; give the
  // stream a moment to be established before the line is written.
  await page.waitForTimeout(500);
  const logged = await fetch(t.base + '/v1/demo/examples/pinger/' + seg(t.pinger) + '/config/log?name=' + seg(marker), {
    method: 'POST',
    headers: { authorization: 'Bearer ' + t.token },
  });
  check(logged.status === 200, 'the actor logged (status ' + logged.status + ')');
  await page.waitForFunction((m) => document.getElementById('live-log').textContent.includes(m), marker);
  check((await page.$$('#live-log script')).length === 0, 'the log line stays text');
  check(await page.evaluate(() => window.pwned === undefined), 'no hostile script ran from the log');
  await shot(page, 'live-log');

  step = 'see a named timer';
  await page.goto(t.base + '/console#/actor/demo/examples/timers/' + seg(t.timers));
  // The same page object: wait for this actor's page, not the last one's.
  await page.waitForSelector(`#actor-name:text-is("${t.timers}")`);
  await page.waitForSelector('#pending h3');
  check((await page.textContent('#pending')).includes('Named timers: 1'), 'the timer is counted');
  check((await page.textContent('#pending table')).includes(t.timer), 'the timer name shows as text');
  check((await page.$$('#pending b')).length === 0, 'no element came from the timer name');

  step = 'see the alarm in the index';
  await page.click('nav a[href="#/alarms"]');
  const alarmLink = '#/actor/demo/examples/reminder/' + seg(t.reminder);
  await page.waitForSelector(`a[href="${alarmLink}"]`);
  const flakyRow = await page.textContent(`tr:has(a[href="#/actor/demo/examples/reminder/${seg(t.flaky)}"])`);
  check(/retrying \(\d+ failures?\)/.test(flakyRow), 'the failing alarm shows as retrying: ' + flakyRow);
  const laterRow = await page.textContent(`tr:has(a[href="${alarmLink}"])`);
  check(laterRow.includes('later') && !laterRow.includes('retrying'), 'the alarm an hour ahead is not retrying: ' + laterRow);
  await shot(page, 'alarms');

  step = 'run the alarm now';
  await page.click(`a[href="${alarmLink}"]`);
  await page.click('button:text("Run alarm now")');
  await page.waitForSelector('#action-status:text("The alarm ran.")');
  const fired = await (await fetch(t.base + '/v1/demo/examples/reminder/' + seg(t.reminder) + '/fired', {
    headers: { authorization: 'Bearer ' + t.token },
  })).json();
  check(fired.fired.length === 1, 'the handler ran once: ' + JSON.stringify(fired));

  step = 'export an actor';
  await page.click('button:text("Export")');
  await page.waitForSelector('#action-status a[download]');
  const [download] = await Promise.all([page.waitForEvent('download'), page.click('#action-status a[download]')]);
  const path = await download.path();
  const { readFileSync } = await import('node:fs');
  check(readFileSync(path).subarray(0, 15).toString() === 'SQLite format 3', 'the download is a SQLite database');

  step = 'delete an actor with confirmation';
  await page.goto(t.base + '/console#/actor/demo/examples/notes/' + seg(t.doomed));
  await page.waitForSelector(`#actor-name:text-is("${t.doomed}")`);
  await page.waitForSelector('button:text("Delete")');
  await page.click('button:text("Delete")');
  await page.waitForSelector('#action-status:text("Deleted.")');
  check(dialogs.some((d) => d.startsWith('confirm: Delete actor ' + t.doomed)), 'the delete asked first');

  step = 'a same-origin page without the CSRF value';
  const other = await context.newPage();
  await other.goto(t.base + '/healthz');
  const status = await other.evaluate(async () => (await fetch('/admin/v1/apps', { credentials: 'same-origin' })).status);
  check(status === 401, 'another page of the origin riding the session cookie is refused (got ' + status + ')');
  await other.close();

  step = 'a page of the origin later in the same tab';
  // A tenant's page the operator opens in the console's tab shares the
  // tab's storage: nothing of the session may be there.
  await page.goto(t.base + '/healthz');
  const stored = await page.evaluate(() => sessionStorage.length + localStorage.length);
  check(stored === 0, 'the console left ' + stored + ' items in the tab\'s storage');
  const fromTab = await page.evaluate(async () => (await fetch('/admin/v1/apps', { credentials: 'same-origin' })).status);
  check(fromTab === 401, 'the same tab, on another page, is refused (got ' + fromTab + ')');
  await page.goto(t.base + '/console');
  await page.waitForSelector('#login');
  await page.fill('#token', t.token);
  await page.click('#login button[type=submit]');
  await page.waitForSelector('h1:text("Overview")');

  step = 'a phone-width screen';
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(t.base + '/console#/actor/demo/examples/notes/' + seg(t.hostile));
  await page.waitForSelector('#kv table');
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, 'the page fits a phone width (overflows by ' + overflow + ' px)');
  await shot(page, 'actor-phone');

  step = 'log out';
  const csrf = await page.evaluate(() => csrf);
  check(typeof csrf === 'string' && csrf.length === 64, 'the page holds its CSRF value');
  await page.click('#logout');
  await page.waitForSelector('#login');
  const after = await page.evaluate(async (c) => (await fetch('/admin/v1/apps', { headers: { 'x-wasmkeep-csrf': c } })).status, csrf);
  check(after === 401, 'the session ended at logout (got ' + after + ')');
  await page.goto(t.base + '/console#/apps');
  await page.waitForSelector('#login');

  check(!dialogs.some((d) => !d.startsWith('confirm:')), 'no alert or prompt: ' + dialogs.join(' | '));
  check(pageErrors.length === 0, 'no script error: ' + pageErrors.join(' | '));
} catch (e) {
  failures.push(step + ': ' + e.message.split('\n')[0]);
  for (const p of browser.contexts().flatMap((c) => c.pages())) {
    failures.push('page ' + p.url() + ' shows: ' + (await p.textContent('main').catch(() => '?')).slice(0, 400));
  }
} finally {
  await browser.close();
}
if (failures.length) {
  console.error('console test failed:\n- ' + failures.join('\n- '));
  process.exit(1);
}
console.log('console test passed');
