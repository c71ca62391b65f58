// The wasmkeep console (issue 39, ADR 0063): pages routed by the address's
// hash, drawn from the node's admin API.
//
// Rules a change must keep:
// - Whatever the node answers (names, values, log lines, errors) enters the
//   page as text: through `h` and `textContent`, never as HTML.
// - Every request carries the session's CSRF value, kept in a variable of
//   this script only: not in any storage, which other pages of the origin
//   (a tenant's, in this very tab after a navigation) could read. A reload
//   asks for the token again.
// - Links the console draws are its own `#/` routes; it never navigates to
//   a tenant's page.
'use strict';

/** Rows a table or KV browser shows per page. */
const PAGE_ROWS = 50;
/** Log lines an actor's live log keeps on screen. */
const LOG_LINES_SHOWN = 500;
const OVERVIEW_REFRESH_MS = 10000;
/** How often an actor's log is asked again in a cluster (its lines are on the node that ran it). */
const CLUSTER_LOG_POLL_MS = 2000;
/** Lines an actor's log shows in a cluster (the latest, of every node). */
const CLUSTER_LOG_LINES = 100;

const main = document.getElementById('main');
const nav = document.getElementById('nav');
/** The session's CSRF value, from the login; `null` when logged out. */
let csrf = null;

// ---- drawing ------------------------------------------------------------

/** An element with attributes and children; strings become text nodes. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'on') {
      for (const [ev, f] of Object.entries(v)) el.addEventListener(ev, f);
    } else if (k === 'class') {
      el.className = v;
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A link to one of the console's own routes, from raw path segments. */
function link(text, ...segments) {
  return h('a', { href: '#/' + segments.map(encodeURIComponent).join('/') }, text);
}

/** Children without the absent ones (`null`, `undefined`, `false`). */
function present(children) {
  return children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false);
}

/**
 * The page being shown. A page draws and registers what to undo (timers,
 * log streams) through the view it started with, so a page the operator
 * left, still loading, draws nothing and stops at once.
 */
function newView() {
  const v = { live: true, cleanups: [] };
  v.show = (...children) => { if (v.live) main.replaceChildren(...present(children)); };
  v.cleanup = (f) => { if (v.live) v.cleanups.push(f); else f(); };
  v.end = () => {
    v.live = false;
    for (const f of v.cleanups) f();
    v.cleanups = [];
  };
  return v;
}
let view = newView();

/** Ends the shown page and starts the next one. */
function nextView() {
  view.end();
  view = newView();
  return view;
}

function errorBox(e) {
  const code = e && e.code ? e.code : 'error';
  return h('p', { class: 'error', role: 'alert' }, h('code', {}, code), ' ', e && e.message ? e.message : String(e));
}

/** A cell's text: JSON for objects, a blob's hex as the node gives it. */
function cellText(v) {
  if (v === null || v === undefined) return '∅';
  if (typeof v === 'object') {
    if (v.blob_hex !== undefined) return 'x\'' + v.blob_hex + '\'';
    return JSON.stringify(v);
  }
  return String(v);
}

/** A grid of rows under `columns`. */
function grid(columns, rows, cls) {
  return h('div', { class: 'scroll' },
    h('table', { class: cls || 'grid' },
      h('thead', {}, h('tr', {}, columns.map((c) => h('th', {}, c)))),
      h('tbody', {}, rows.map((r) => h('tr', {}, r.map((c) => h('td', {}, c instanceof Node ? c : cellText(c))))))));
}

/** A two-column table of an object's fields. */
function fields(obj) {
  return grid(['field', 'value'], Object.entries(obj || {}).map(([k, v]) => [k, v]), 'fields');
}

function when(ms) {
  if (ms === null || ms === undefined) return '—';
  // Not a time (a guest wrote the column): shown as it is.
  if (typeof ms !== 'number' || !Number.isFinite(ms) || Math.abs(ms) > 8.64e15) return cellText(ms);
  const d = new Date(ms);
  const rel = Math.round((ms - Date.now()) / 1000);
  const ago = rel >= 0 ? 'in ' + rel + ' s' : -rel + ' s ago';
  return d.toISOString().replace('T', ' ').replace('Z', ' UTC') + ' (' + ago + ')';
}

function bytes(n) {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return (i ? n.toFixed(1) : n) + ' ' + units[i];
}

// ---- the admin API ----------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Calls `/admin/v1/<path>` (or an absolute path) with the session. */
async function api(path, opts = {}) {
  const url = path.startsWith('/') ? path : '/admin/v1/' + path;
  const headers = Object.assign({ 'x-wasmkeep-csrf': csrf || '' }, opts.headers || {});
  const r = await fetch(url, {
    method: opts.method || 'GET',
    headers,
    body: opts.body,
    credentials: 'same-origin',
    cache: 'no-store',
    signal: opts.signal,
  });
  if (r.status === 401 && !opts.login) {
    csrf = null;
    login('Your session ended: log in again.');
    throw new ApiError(401, 'unauthorized', 'not logged in');
  }
  if (opts.raw && r.ok) return r;
  const text = await r.text();
  let body = text;
  try { body = text ? JSON.parse(text) : null; } catch (_) { /* a text answer */ }
  if (!r.ok) {
    const e = body && body.error ? body.error : {};
    throw new ApiError(r.status, e.code || 'http_' + r.status, e.message || String(text));
  }
  return body;
}

/** Calls `api` and draws its error in place of `fallback` on failure. */
async function load(path, opts) {
  try {
    return { ok: await api(path, opts) };
  } catch (e) {
    if (e.status === 401) throw e;
    return { err: e };
  }
}

// ---- log in and out ---------------------------------------------------------

function login(message) {
  nav.hidden = true;
  // Not offered to the browser's password manager: a saved token would be
  // offered to any form a tenant's page on this origin draws.
  const token = h('input', { type: 'password', id: 'token', name: 'wasmkeep-admin-token', autocomplete: 'off', 'data-lpignore': 'true', required: true, 'aria-label': 'admin token' });
  const status = h('p', { class: 'muted', id: 'login-status' }, message || 'Log in with the node\'s admin token.');
  const form = h('form', { id: 'login', class: 'card' },
    h('h1', {}, 'wasmkeep console'),
    status,
    h('label', { for: 'token' }, 'Admin token'),
    token,
    h('button', { type: 'submit' }, 'Log in'));
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    try {
      const r = await api('/console/login', {
        method: 'POST',
        body: JSON.stringify({ token: token.value }),
        headers: { 'content-type': 'application/json' },
        login: true,
      });
      csrf = r.csrf;
      token.value = '';
      route();
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
  });
  nextView().show(form);
  token.focus();
}

document.getElementById('logout').addEventListener('click', async () => {
  try { await api('console/logout', { method: 'POST', login: true }); } catch (_) { /* gone already */ }
  csrf = null;
  login('Logged out.');
});

// ---- overview -----------------------------------------------------------------

/** Series drawn in one chart at most (one per node; four colours, repeating). */
const CHART_SERIES_MAX = 16;

/**
 * A small line chart over the last hour, drawn as SVG: one line per series (`{ name, points:
 * [[at_ms, value]] }`, a null value is a gap), placed by time so that nodes sampling at different
 * instants line up. The caption gives each series' latest value.
 */
function chart(title, series, unit) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('viewBox', '0 0 300 60');
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('class', 'chart');
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', title);
  const shown = series.slice(0, CHART_SERIES_MAX);
  const good = (v) => v !== null && Number.isFinite(v);
  const known = shown.flatMap((s) => s.points.filter((p) => good(p[1])).map((p) => p[1]));
  const times = shown.flatMap((s) => s.points.map((p) => p[0]));
  const max = Math.max(1e-9, ...known);
  const tEnd = Math.max(0, ...times);
  const tStart = Math.min(tEnd - 1, ...times);
  const fmt = (v) => (unit === '%' ? v.toFixed(2) : v < 10 ? v.toFixed(2) : v.toFixed(0));
  const latest = [];
  shown.forEach((s, k) => {
    let d = '';
    let last = null;
    s.points.forEach(([t, v], i) => {
      if (!good(v)) return;
      const x = ((t - tStart) / (tEnd - tStart)) * 300;
      const y = 58 - (v / max) * 54;
      d += (i > 0 && good(s.points[i - 1][1]) ? 'L' : 'M') + x.toFixed(1) + ' ' + y.toFixed(1);
      last = v;
    });
    const path = document.createElementNS(ns, 'path');
    path.setAttribute('d', d);
    path.setAttribute('class', 's' + (k % 4));
    svg.append(path);
    const value = last === null ? '—' : fmt(last) + ' ' + unit;
    // A node's id is 32 hex digits: its first 8 tell the nodes apart here (the title has it whole).
    latest.push(shown.length > 1 ? h('span', { class: 'legend s' + (k % 4), title: s.name }, s.name.slice(0, 8) + ' ' + value) : value);
  });
  return h('figure', { class: 'card' },
    h('figcaption', {}, title, ': ', latest.map((x) => [x, ' ']),
      h('span', { class: 'muted' }, '(max ', known.length ? fmt(max) : '—', ')')),
    svg);
}

async function overview() {
  const v = view;
  const draw = async () => {
    const node = await load('node');
    const cluster = node.ok && node.ok.cluster;
    const [apps, hist] = await Promise.all([load('apps'), load('node/history' + (cluster ? '?cluster=true' : ''))]);
    // One series per node: this one first, then every other live node's own answer.
    const nodes = hist.ok ? [{ node: hist.ok.node || 'this node', points: hist.ok.points, now: hist.ok.now }].concat(hist.ok.others || []) : [];
    const answered = nodes.filter((n) => n.points !== null);
    const silent = nodes.filter((n) => n.points === null).map((n) => n.node);
    const sum = (k) => (answered.some((n) => n.now) ? answered.reduce((a, n) => a + ((n.now && n.now[k]) || 0), 0) : undefined);
    const stat = (value, label) => h('div', { class: 'card stat' }, h('b', {}, value === undefined ? '—' : value), label);
    const col = (k, scale) => answered.map((n) => ({
      name: n.node,
      points: n.points.map((p) => [p.at_ms, p[k] === null || p[k] === undefined ? null : p[k] * (scale || 1)]),
    }));
    v.show(
      h('h1', {}, 'Overview'),
      h('div', { class: 'cards' },
        stat(apps.ok ? apps.ok.apps.length : undefined, ' apps'),
        stat(sum('instances_active'), ' actors open'),
        stat(sum('alarms_pending'), ' alarms pending'),
        stat(sum('outbox_pending'), ' outbox rows pending'),
        cluster ? stat(nodes.length, ' nodes live') : null,
        stat(cluster ? cluster.node : 'single node', cluster ? ' epoch ' + cluster.epoch + (cluster.acting ? ', acting' : ', not acting') : '')),
      h('p', { class: 'muted' }, cluster ? 'Every live node' : 'This node', ' over the last hour: one point per ', (hist.ok ? hist.ok.sample_ms : 0) / 1000, ' s',
        cluster ? ', one line per node; the counts above add up the nodes.' : '.',
        silent.length ? ' Nodes that did not answer: ' + silent.join(', ') + '.' : ''),
      hist.err ? errorBox(hist.err) : null,
      h('div', { class: 'charts' },
        chart('requests/s', col('requests_per_s'), '/s'),
        chart('event p50', col('event_p50_ms'), 'ms'),
        chart('event p99', col('event_p99_ms'), 'ms'),
        chart('error rate', col('error_rate', 100), '%'),
        chart('alarm lateness p99', col('alarm_lateness_p99_ms'), 'ms'),
        chart('upload lag p99', col('upload_lag_p99_ms'), 'ms'),
        cluster ? chart('sweep lag', col('sweep_lag_ms'), 'ms') : null),
      node.err ? errorBox(node.err) : null,
      cluster ? h('section', {}, h('h2', {}, 'This node'), fields(cluster)) : null,
    );
  };
  await draw();
  const timer = setInterval(() => { draw().catch(() => {}); }, OVERVIEW_REFRESH_MS);
  v.cleanup(() => clearInterval(timer));
}

// ---- apps -------------------------------------------------------------------

async function apps() {
  const v = view;
  const r = await load('apps');
  if (r.err) return v.show(h('h1', {}, 'Apps'), errorBox(r.err));
  v.show(
    h('h1', {}, 'Apps'),
    grid(['app', 'version', 'classes', 'deployed', 'size'], r.ok.apps.map((a) => [
      link(a.tenant + '/' + a.app, 'app', a.tenant, a.app),
      a.version,
      h('span', {}, a.classes.map((c) => [link(c, 'class', a.tenant, a.app, c), ' '])),
      when(a.deployed_ms),
      bytes(a.component_bytes),
    ])),
  );
}

async function app(tenant, name) {
  const v = view;
  const [info, versions, secrets] = await Promise.all([
    load('apps/' + encodeURIComponent(tenant) + '/' + encodeURIComponent(name)),
    load('apps/' + encodeURIComponent(tenant) + '/' + encodeURIComponent(name) + '/versions'),
    load('apps/' + encodeURIComponent(tenant) + '/' + encodeURIComponent(name) + '/secrets'),
  ]);
  if (info.err) return v.show(h('h1', {}, tenant + '/' + name), errorBox(info.err));
  const a = info.ok;
  const secretNames = secrets.ok ? secrets.ok.names || [] : [];
  v.show(
    h('h1', {}, tenant + '/' + name),
    h('h2', {}, 'Classes'),
    h('ul', {}, (a.classes || []).map((c) => h('li', {}, link(c, 'class', tenant, name, c)))),
    h('h2', {}, 'Versions'),
    versions.err ? errorBox(versions.err) : grid(['version', 'hash', 'deployed', 'by', 'classes'], (versions.ok.versions || []).map((v) => [
      v.version, (v.hash || '').slice(0, 16), when(v.deployed_ms), v.deployed_by || v.by || '', (v.classes || []).join(' '),
    ])),
    h('h2', {}, 'Settings'),
    h('pre', { class: 'json' }, JSON.stringify(a.manifest || {}, null, 2)),
    h('h2', {}, 'Secrets'),
    h('p', { class: 'muted' }, 'Names only: the console never shows a secret\'s value.'),
    secrets.err ? errorBox(secrets.err) : h('ul', {}, secretNames.map((n) => h('li', {}, n))),
  );
}

// ---- a class's actors ----------------------------------------------------------

async function actorsOfClass(tenant, name, cls, query) {
  const v = view;
  const q = new URLSearchParams(query || '');
  const prefix = q.get('prefix') || '';
  const after = q.get('after') || '';
  const base = 'actors/' + [tenant, name, cls].map(encodeURIComponent).join('/');
  const params = new URLSearchParams({ all: 'true', limit: String(PAGE_ROWS) });
  if (prefix) params.set('prefix', prefix);
  if (after) params.set('after', after);
  const countParams = new URLSearchParams({ all: 'true', count: 'true' });
  if (prefix) countParams.set('prefix', prefix);
  const [page, count] = await Promise.all([load(base + '?' + params), load(base + '?' + countParams)]);
  const search = h('input', { type: 'search', id: 'prefix', placeholder: 'name prefix', value: prefix, 'aria-label': 'name prefix' });
  const form = h('form', { class: 'inline' }, search, h('button', { type: 'submit' }, 'Search'));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = '#/class/' + [tenant, name, cls].map(encodeURIComponent).join('/') + '?' + new URLSearchParams({ prefix: search.value });
  });
  const names = page.ok ? page.ok.actors.map((a) => (typeof a === 'string' ? a : a.name)) : [];
  const next = page.ok && page.ok.next;
  const more = next ? h('a', { href: '#/class/' + [tenant, name, cls].map(encodeURIComponent).join('/') + '?' + new URLSearchParams({ prefix, after: next }) }, 'Next page →') : null;
  v.show(
    h('h1', {}, tenant + '/' + name + '/' + cls),
    form,
    h('p', { class: 'muted', id: 'actor-count' }, count.ok
      ? (count.ok.source === 'bucket' ? 'Actors in the cluster' : 'Actors on this node') + (prefix ? ' named ' + prefix + '…' : '') + ': '
        + cellText(count.ok.count) + (count.ok.complete === false ? ' or more (counted up to ' + count.ok.limit + ')' : '')
      : count.err ? 'count: ' + count.err.message : ''),
    page.err ? errorBox(page.err) : grid(['actor'], names.map((n) => [link(n, 'actor', tenant, name, cls, n)])),
    more,
  );
}

// ---- one actor ---------------------------------------------------------------------

function actorPath(id) {
  return 'actors/' + [id.tenant, id.app, id.class, id.name].map(encodeURIComponent).join('/');
}

async function sql(id, text) {
  return api(actorPath(id) + '/sql', { method: 'POST', body: text, headers: { 'content-type': 'text/plain' } });
}

/** A result's grid, or its error. */
function resultGrid(r) {
  return grid(r.columns || [], r.rows || []);
}

function sqlConsole(id) {
  const input = h('textarea', { id: 'sql', rows: 3, spellcheck: 'false', 'aria-label': 'SQL' }, 'SELECT name, type FROM sqlite_master ORDER BY name');
  const out = h('div', { id: 'sql-result' });
  const form = h('form', { class: 'card' }, h('label', { for: 'sql' }, 'Read-only SQL'), input, h('button', { type: 'submit', id: 'run-sql' }, 'Run'), out);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    out.replaceChildren(h('p', { class: 'muted' }, 'running…'));
    try {
      out.replaceChildren(resultGrid(await sql(id, input.value)));
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  });
  return form;
}

async function tableBrowser(id, holder, table, offset) {
  const quoted = '"' + table.replace(/"/g, '""') + '"';
  try {
    const r = await sql(id, 'SELECT * FROM ' + quoted + ' LIMIT ' + PAGE_ROWS + ' OFFSET ' + offset);
    const prev = offset > 0 ? h('button', { type: 'button', on: { click: () => tableBrowser(id, holder, table, Math.max(0, offset - PAGE_ROWS)) } }, '← Previous') : null;
    const next = (r.rows || []).length === PAGE_ROWS ? h('button', { type: 'button', on: { click: () => tableBrowser(id, holder, table, offset + PAGE_ROWS) } }, 'Next →') : null;
    holder.replaceChildren(...present([h('h3', {}, table, h('span', { class: 'muted' }, ' rows ', offset + 1, '–', offset + (r.rows || []).length)), resultGrid(r), prev, next]));
  } catch (e) {
    holder.replaceChildren(errorBox(e));
  }
}

/** An access line: the request, its answer and how long it took. */
function accessText(a) {
  return a.method + ' ' + a.path + ' → ' + a.status + ' in ' + (a.duration_us / 1000).toFixed(1) + ' ms' + (a.code ? ' (' + a.code + ')' : '') + (a.version ? ' v' + a.version : '');
}

/** One log line as a list item (`raw`: the line as it came, when it is not JSON). */
function logItem(rec, raw) {
  return h('li', { class: 'log-' + (rec.level || 'info') },
    h('span', { class: 'muted' }, rec.at_ms ? new Date(rec.at_ms).toISOString().slice(11, 23) + ' ' : ''),
    rec.node ? h('span', { class: 'muted' }, '[' + rec.node + '] ') : '',
    h('b', {}, (rec.level || '') + ' '),
    rec.access ? accessText(rec.access) : rec.message !== undefined ? String(rec.message) : raw);
}

/**
 * An actor's live log. On a single node it follows the node's stream; in a cluster it asks every
 * node's kept lines again every CLUSTER_LOG_POLL_MS (the actor's lines are on whichever node ran
 * it, and it may move) and shows the latest, merged by time.
 */
function liveLog(v, id, list, clustered) {
  const scope = '/admin/v1/logs/' + [id.tenant, id.app, id.class, id.name].map(encodeURIComponent).join('/');
  if (clustered) return polledLog(v, scope, list);
  const ctl = new AbortController();
  v.cleanup(() => ctl.abort());
  const path = scope + '?follow=true&lines=50';
  (async () => {
    try {
      const r = await api(path, { raw: true, signal: ctl.signal });
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (!line.trim()) continue;
          let rec = null;
          try { rec = JSON.parse(line); } catch (_) { /* not JSON: shown as it is */ }
          if (rec === null || typeof rec !== 'object') rec = { message: line };
          if (rec.missed !== undefined) rec = { level: 'warn', message: rec.missed + ' lines were left out (the stream fell behind)' };
          list.append(logItem(rec, line));
          while (list.childElementCount > LOG_LINES_SHOWN) list.firstElementChild.remove();
        }
      }
    } catch (e) {
      if (e.name !== 'AbortError' && e.status !== 401) list.append(h('li', { class: 'error' }, 'log stream ended: ', e.message));
      return;
    }
    if (!ctl.signal.aborted) list.append(h('li', { class: 'error' }, 'log stream ended (the node closed it)'));
  })();
}

function polledLog(v, scope, list) {
  let stopped = false;
  const poll = async () => {
    // The node merges every node's lines by time: each answer replaces the list.
    const r = await api(scope + '?lines=' + CLUSTER_LOG_LINES + '&cluster=true', { raw: true });
    const text = await r.text();
    const items = [];
    const missing = [];
    for (const line of text.split('\n')) {
      if (!line.trim()) continue;
      let rec;
      try { rec = JSON.parse(line); } catch (_) { continue; }
      if (rec === null || typeof rec !== 'object') continue;
      if (rec.node_unreachable !== undefined) { missing.push(String(rec.node_unreachable)); continue; }
      items.push(logItem(rec, line));
    }
    if (missing.length) items.push(h('li', { class: 'muted' }, 'nodes that did not answer: ' + missing.join(', ')));
    if (!stopped) list.replaceChildren(...items);
  };
  // The next poll starts when the last one ended, so that answers never overtake each other.
  let timer = null;
  const next = () => { if (!stopped) timer = setTimeout(() => poll().catch(() => {}).finally(next), CLUSTER_LOG_POLL_MS); };
  v.cleanup(() => { stopped = true; clearTimeout(timer); });
  poll()
    .catch((e) => { if (e.status !== 401) list.append(h('li', { class: 'error' }, 'the log could not be read: ', e.message)); })
    .finally(next);
}

async function actor(tenant, name, cls, actorName) {
  const v = view;
  const id = { tenant, app: name, class: cls, name: actorName };
  const info = await load(actorPath(id));
  const title = h('h1', {}, tenant + '/' + name + '/' + cls + '/', h('span', { id: 'actor-name' }, actorName));
  if (info.err) return v.show(title, errorBox(info.err));
  const i = info.ok;
  const status = h('p', { id: 'action-status', role: 'status' });
  let exported = null;
  const act = (label, confirmText, f) => h('button', {
    type: 'button',
    on: {
      click: async () => {
        if (confirmText && !window.confirm(confirmText)) return;
        status.replaceChildren('…');
        try { status.replaceChildren(await f()); } catch (e) { status.replaceChildren(errorBox(e)); }
      },
    },
  }, label);
  const actions = h('div', { class: 'actions' },
    act('Run alarm now', 'Run this actor\'s alarm now?', async () => {
      const r = await api(actorPath(id) + '/alarm/run', { method: 'POST' });
      if (!r.ran) return 'The actor has no alarm.';
      if (r.failed) return errorBox({ code: r.failed.code, message: 'The alarm ran and failed (it backs off and is retried): ' + r.failed.message });
      return 'The alarm ran.';
    }),
    act('Export', null, async () => {
      const r = await api(actorPath(id) + '/database', { raw: true });
      const blob = await r.blob();
      const url = URL.createObjectURL(blob);
      // The copy is held in memory until the page goes or the next export.
      if (exported) URL.revokeObjectURL(exported);
      exported = url;
      v.cleanup(() => URL.revokeObjectURL(url));
      return h('a', { href: url, download: actorName + '.db' }, 'Download ' + actorName + '.db (' + bytes(blob.size) + ')');
    }),
    act('Delete', 'Delete actor ' + actorName + ' and all its data? This cannot be undone.', async () => {
      const r = await api(actorPath(id), { method: 'DELETE' });
      return r.deleted ? 'Deleted.' : 'There was nothing to delete.';
    }));
  const summary = {
    owner: (i.owner_node || 'this node') + (i.active ? ' (open)' : ''),
    open_sockets: i.open_sockets,
    version: i.version,
    size: bytes(i.database_bytes),
    alarm: when(i.alarm_ms),
    alarm_retries: i.alarm_retry_count,
    last_write: when(i.last_write_ms),
    alarm_indexed: i.alarm_indexed,
  };
  const kv = h('div', { id: 'kv' });
  const tables = h('div', { id: 'tables' });
  const browser = h('div', { id: 'table-browser' });
  const pending = h('div', { id: 'pending' });
  const log = h('ol', { id: 'live-log', class: 'log' });
  const traced = h('div', { id: 'actor-traces' });
  v.show(title, actions, status,
    h('section', {}, h('h2', {}, 'State'), fields(summary)),
    h('section', {}, h('h2', {}, 'Pending work'), pending),
    h('section', {}, h('h2', {}, 'Key-value'), kv),
    h('section', {}, h('h2', {}, 'Tables'), tables, browser),
    h('section', {}, h('h2', {}, 'SQL'), sqlConsole(id)),
    h('section', {}, h('h2', {}, 'Live log'), log),
    h('section', {}, h('h2', {}, 'Traced requests'), traced));
  liveLog(v, id, log, Boolean(i.owner_node));
  load('traces?limit=200&actor=' + encodeURIComponent([tenant, name, cls, actorName].join('/'))).then((t) => {
    if (t.err) return traced.replaceChildren(errorBox(t.err));
    // The prefix also matches longer names: keep this actor's own.
    const mine = t.ok.requests.filter((sp) => sp.attributes['wasmkeep.actor'] === [tenant, name, cls, actorName].join('/'));
    traced.replaceChildren(mine.length ? traceRows(mine.slice(0, 20)) : h('p', { class: 'muted' }, 'None kept on this node (see trace_sample_pct).'));
  }).catch(() => {});
  try {
    const r = await sql(id, 'SELECT CAST(key AS TEXT) AS key, CAST(value AS TEXT) AS value, length(value) AS bytes FROM _wasmkeep_kv ORDER BY key LIMIT ' + PAGE_ROWS);
    kv.replaceChildren(resultGrid(r));
  } catch (e) { kv.replaceChildren(errorBox(e)); }
  try {
    const r = await sql(id, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name LIKE '\\_%' ESCAPE '\\', name");
    const names = (r.rows || []).map((row) => row[0]);
    tables.replaceChildren(h('ul', { class: 'inline-list' }, names.map((t) => h('li', {}, h('button', { type: 'button', class: 'link', on: { click: () => tableBrowser(id, browser, t, 0) } }, t)))));
    // The outbox's rows not yet handed over, and the SDKs' named timers
    // (their table exists once the actor used one).
    const parts = [];
    if (names.includes('_wasmkeep_outbox')) {
      const o = await sql(id, "SELECT seq, CASE kind WHEN 1 THEN 'message' WHEN 2 THEN 'http' ELSE kind END AS kind, method, target, created_ms, (SELECT count(*) FROM _wasmkeep_outbox) AS pending FROM _wasmkeep_outbox ORDER BY seq LIMIT " + PAGE_ROWS);
      parts.push(h('h3', {}, 'Outbox rows pending: ', o.rows.length ? o.rows[0][5] : 0));
      if (o.rows.length) parts.push(grid(['seq', 'kind', 'method', 'target', 'created'], o.rows.map((r) => [r[0], r[1], r[2], r[3], when(r[4])])));
    }
    if (names.includes('wasmkeep_sdk_timers')) {
      const tm = await sql(id, 'SELECT name, due_ms FROM wasmkeep_sdk_timers ORDER BY due_ms, name LIMIT ' + PAGE_ROWS);
      parts.push(h('h3', {}, 'Named timers: ', tm.rows.length));
      if (tm.rows.length) parts.push(grid(['name', 'due'], tm.rows.map((r) => [r[0], when(r[1])])));
    }
    pending.replaceChildren(...(parts.length ? parts : [h('p', { class: 'muted' }, 'No outbox rows and no named timers.')]));
  } catch (e) { tables.replaceChildren(errorBox(e)); }
}

// ---- alarms and the cluster -------------------------------------------------------------

async function alarms(tenant) {
  const v = view;
  const appsR = await load('apps');
  const tenants = appsR.ok ? [...new Set(appsR.ok.apps.map((a) => a.tenant))].sort() : [];
  const t = tenant || tenants[0];
  const picker = h('p', {}, 'Tenant: ', tenants.map((x) => [x === t ? h('b', {}, x) : link(x, 'alarms', x), ' ']));
  if (!t) return v.show(h('h1', {}, 'Alarms'), picker, h('p', { class: 'muted' }, 'No app is deployed.'));
  const r = await load('alarms/' + encodeURIComponent(t) + '?cluster=true');
  if (r.err) return v.show(h('h1', {}, 'Alarms'), picker, errorBox(r.err));
  const now = Date.now();
  const clustered = Boolean(r.ok.index);
  const rows = (r.ok.alarms || []).map((a) => [
    link(a.app + '/' + a.class + '/' + a.name, 'actor', t, a.app, a.class, a.name),
    clustered ? a.node : null,
    when(a.alarm_ms),
    a.retry_count > 0 ? h('span', { class: 'error' }, 'retrying (' + a.retry_count + (a.retry_count === 1 ? ' failure)' : ' failures)'))
      : a.alarm_ms <= now ? 'overdue' : a.alarm_ms - now < 60000 ? 'due soon' : 'later',
  ]);
  v.show(
    h('h1', {}, 'Alarms'),
    picker,
    h('h2', {}, clustered ? 'Pending on every live node' : 'Pending on this node'),
    (r.ok.nodes_unreachable || []).length ? h('p', { class: 'muted' }, 'Nodes that did not answer: ' + r.ok.nodes_unreachable.join(', ')) : null,
    grid(clustered ? ['actor', 'node', 'due', 'state'] : ['actor', 'due', 'state'], clustered ? rows : rows.map((x) => x.filter((_, i) => i !== 1))),
    r.ok.index ? [
      h('h2', {}, 'The bucket\'s alarm index'),
      h('p', { class: 'muted' }, 'What every node\'s sweep reads: an entry whose actor\'s node died is fired by another node.'),
      grid(['actor', 'due', 'state', 'tag'], r.ok.index.map((e) => [
        e.app ? link(e.app + '/' + e.class + '/' + e.name, 'actor', t, e.app, e.class, e.name) : '(tenant-wide) ' + e.class + '/' + e.name,
        when(e.due_ms),
        e.due_ms <= now ? 'overdue' : e.due_ms - now < 60000 ? 'due soon' : 'later',
        e.generation === null ? 'untagged' : e.generation + '-' + e.nonce,
      ])),
    ] : null,
  );
}

async function cluster() {
  const v = view;
  const [r, node] = await Promise.all([load('cluster'), load('node')]);
  if (r.err && r.err.code === 'not_a_cluster') return v.show(h('h1', {}, 'Cluster'), h('p', {}, 'A single node: it is not in a cluster (start nodes with --bucket and --advertise to form one).'));
  if (r.err) return v.show(h('h1', {}, 'Cluster'), errorBox(r.err));
  const nodes = r.ok.nodes || [];
  v.show(
    h('h1', {}, 'Cluster'),
    h('p', { class: 'muted' }, 'Live nodes, from their lease records in the bucket. Not live (released, fenced, lapsed): ', r.ok.not_live,
      '; unreadable: ', r.ok.unreadable, r.ok.truncated ? '; the list was cut' : ''),
    grid(['node', 'address', 'epoch', 'lease age', 'expires in', 'holds'], nodes.map((n) => [
      n.self ? h('b', {}, n.node, ' (this node)') : n.node,
      n.address,
      n.epoch,
      n.lease_age_ms + ' ms',
      n.expires_in_ms + ' ms',
      n.held_actors === null ? 'did not answer' : n.held_actors + ' actors',
    ])),
    node.ok && node.ok.cluster ? [h('h2', {}, 'This node\'s lease'), fields(node.ok.cluster)] : null,
  );
}

// ---- traces -------------------------------------------------------------------------------

function traceRows(list) {
  // A request, or an event the node started itself (`consumer`: an alarm's run, a socket's message).
  return grid(['when', 'request', 'status', 'took', 'actor', 'trace'], list.map((sp) => [
    when(Math.floor(sp.start_unix_ns / 1e6)),
    sp.kind === 'consumer' ? sp.name : sp.attributes['http.request.method'] + ' ' + sp.attributes['url.path'],
    sp.kind === 'consumer' ? (sp.error || 'ok') : sp.attributes['http.response.status_code'] + (sp.error ? ' ' + sp.error : ''),
    (sp.duration_us / 1000).toFixed(1) + ' ms',
    sp.attributes['wasmkeep.actor'] || '',
    link(sp.trace_id.slice(0, 12) + '…', 'trace', sp.trace_id),
  ]));
}

async function traces() {
  const v = view;
  const r = await load('traces?limit=100');
  if (r.err) return v.show(h('h1', {}, 'Traces'), errorBox(r.err));
  const o = r.ok;
  v.show(
    h('h1', {}, 'Traces'),
    h('p', { class: 'muted' }, 'Requests this node served that were traced: those whose traceparent is sampled, and ', o.sample_pct,
      '% of those without one (trace_sample_pct). Spans recorded here: ', o.spans_recorded,
      o.otlp ? '; exported over OTLP: ' + o.otlp.exported + ', dropped: ' + o.otlp.dropped + ', failed batches: ' + o.otlp.failed_batches : '; no OTLP export.'),
    o.requests.length ? traceRows(o.requests) : h('p', {}, 'No traced request yet.'),
  );
}

/** `td` indented by `depth` (set through the DOM: the policy allows no inline style). */
function indented(td, depth) {
  td.style.paddingLeft = (0.5 + depth * 1.1) + 'rem';
  return td;
}

/** One trace as a timeline: spans of every node, nested under their parents. */
async function trace(traceId) {
  const v = view;
  const r = await load('traces/' + encodeURIComponent(traceId) + '?cluster=true');
  if (r.err) return v.show(h('h1', {}, 'Trace'), errorBox(r.err));
  const spans = r.ok.spans;
  if (!spans.length) return v.show(h('h1', {}, 'Trace ', traceId), h('p', {}, 'No span of this trace is kept (the ring holds the latest spans only).'));
  const start = Math.min(...spans.map((s) => s.start_unix_ns));
  const end = Math.max(...spans.map((s) => s.end_unix_ns));
  const total = Math.max(1, end - start);
  const ids = new Set(spans.map((s) => s.span_id));
  const children = new Map();
  for (const s of spans) {
    const p = s.parent_id && ids.has(s.parent_id) ? s.parent_id : null;
    if (!children.has(p)) children.set(p, []);
    children.get(p).push(s);
  }
  const rows = [];
  // Each span once, however its ids point (a cycle is drawn flat).
  const seen = new Set();
  const walk = (parent, depth) => {
    for (const s of (children.get(parent) || []).sort((a, b) => a.start_unix_ns - b.start_unix_ns)) {
      if (seen.has(s)) continue;
      seen.add(s);
      rows.push([s, depth]);
      if (depth < 64) walk(s.span_id, depth + 1);
    }
  };
  walk(null, 0);
  for (const s of spans) if (!seen.has(s)) rows.push([s, 0]);
  const bar = (s) => {
    const left = ((s.start_unix_ns - start) / total) * 100;
    const width = Math.max(0.3, ((s.end_unix_ns - s.start_unix_ns) / total) * 100);
    const b = h('div', { class: 'bar' + (s.error ? ' bad' : '') });
    b.style.marginLeft = left.toFixed(2) + '%';
    b.style.width = width.toFixed(2) + '%';
    return h('div', { class: 'track' }, b);
  };
  const detail = (s) => {
    const a = s.attributes || {};
    // An alarm's run names the traced event that set it (a span of another trace).
    const links = (s.links || []).filter((l) => /^[0-9a-f]{32}$/.test(l.trace_id));
    if (links.length) return h('span', {}, 'set by ', links.map((l) => link('trace ' + l.trace_id.slice(0, 12) + '…', 'trace', l.trace_id)));
    const status = a['http.response.status_code'] !== undefined ? ' → ' + a['http.response.status_code'] : '';
    return a['db.query.text']
      || (a['http.request.method'] ? a['http.request.method'] + ' ' + (a['url.path'] || a['url.full'] || '') + status : '')
      || (a['wasmkeep.node.to'] ? 'to ' + a['wasmkeep.node.to'] : '')
      || (a['wasmkeep.to'] ? 'to ' + a['wasmkeep.to'] : '')
      || (a['wasmkeep.sql.statements'] !== undefined ? a['wasmkeep.sql.statements'] + ' statements' + (a['wasmkeep.actor'] ? ' in ' + a['wasmkeep.actor'] : '') : '')
      || a['wasmkeep.actor'] || '';
  };
  v.show(
    h('h1', {}, 'Trace ', h('code', {}, traceId)),
    h('p', { class: 'muted' }, spans.length, ' spans over ', (total / 1e6).toFixed(2), ' ms',
      r.ok.nodes_unreachable.length ? '; nodes that did not answer: ' + r.ok.nodes_unreachable.join(', ') : ''),
    h('div', { class: 'scroll' }, h('table', { class: 'grid timeline', id: 'timeline' },
      h('thead', {}, h('tr', {}, ['span', 'node', 'took', 'detail', 'timeline'].map((c) => h('th', {}, c)))),
      h('tbody', {}, rows.map(([s, depth]) => h('tr', { 'data-span': s.name },
        indented(h('td', {}, s.name, s.error ? h('span', { class: 'error' }, ' ' + s.error) : ''), depth),
        h('td', {}, s.node || (s.attributes && s.attributes['wasmkeep.node']) || ''),
        h('td', {}, (s.duration_us / 1000).toFixed(2) + ' ms'),
        h('td', {}, detail(s)),
        h('td', { class: 'tl' }, bar(s))))))),
  );
}

// ---- routing ------------------------------------------------------------------------------

const ROUTES = [
  [/^#?\/?$/, overview],
  [/^#\/apps$/, apps],
  [/^#\/app\/([^/?]+)\/([^/?]+)$/, app],
  [/^#\/class\/([^/?]+)\/([^/?]+)\/([^/?]+)(?:\?(.*))?$/, actorsOfClass],
  [/^#\/actor\/([^/?]+)\/([^/?]+)\/([^/?]+)\/([^/?]+)$/, actor],
  [/^#\/alarms(?:\/([^/?]+))?$/, alarms],
  [/^#\/cluster$/, cluster],
  [/^#\/traces$/, traces],
  [/^#\/trace\/([0-9a-f]{32})$/, trace],
];

async function route() {
  if (csrf === null) return login();
  const v = nextView();
  nav.hidden = false;
  const hash = location.hash || '#/';
  const notFound = () => v.show(h('h1', {}, 'Not found'), h('p', {}, 'No console page at ', hash));
  for (const [re, page] of ROUTES) {
    const m = re.exec(hash);
    if (!m) continue;
    let args;
    try {
      // A class page's last group is its query string, kept as it is.
      args = m.slice(1).map((x, i) => (x === undefined ? undefined : page === actorsOfClass && i === 3 ? x : decodeURIComponent(x)));
    } catch (_) {
      return notFound(); // a malformed escape in the address
    }
    try {
      await page(...args);
    } catch (e) {
      if (e.status !== 401) v.show(errorBox(e));
    }
    return;
  }
  notFound();
}

window.addEventListener('hashchange', route);
route();
