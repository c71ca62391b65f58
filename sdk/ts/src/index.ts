/**
 * The wasmkeep SDK for TypeScript and JavaScript: write durable actors
 * that a wasmkeep node runs, with the same semantics as the Rust SDK.
 *
 * An app is one module whose default export is {@link app}'s result:
 *
 * ```ts
 * import { app, Actor, Request, Response, sql } from "@wasmkeep/sdk";
 *
 * class Counter implements Actor {
 *   init() {
 *     sql.exec("CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)");
 *     sql.exec("INSERT INTO counter VALUES (0, 0)");
 *   }
 *   request(req: Request): Response {
 *     switch (req.route) {
 *       case "POST /increment":
 *         return Response.json({ value: sql.one<{ n: number }>("UPDATE counter SET n = n + 1 RETURNING n").n });
 *       default:
 *         return Response.notFound();
 *     }
 *   }
 * }
 *
 * export default app({ counter: Counter });
 * ```
 *
 * Every handler is synchronous and runs as one transaction over the
 * actor's own SQLite database: what it does through {@link sql},
 * {@link kv}, {@link alarm}, {@link timers} and {@link outbox} commits when
 * it returns, and rolls back when it throws. A handler never waits on the
 * network while it holds the actor: it sends through the {@link outbox}
 * and handles the answer in a later event ({@link Actor.response}).
 *
 * @packageDocumentation
 */

/// <reference path="./wit.d.ts" />
/// <reference path="./globals.d.ts" />

import * as witSql from "wasmkeep:actor/sql@0.2.0";
import * as witKv from "wasmkeep:actor/kv@0.2.0";
import * as witAlarm from "wasmkeep:actor/alarm@0.2.0";
import * as witIdentity from "wasmkeep:actor/identity@0.2.0";
import * as witClock from "wasmkeep:actor/clock@0.2.0";
import * as witLog from "wasmkeep:actor/log@0.2.0";
import * as witResponse from "wasmkeep:actor/response@0.2.0";
import * as witReplies from "wasmkeep:actor/replies@0.2.0";
import * as witSockets from "wasmkeep:actor/sockets@0.2.0";
import * as witConfig from "wasmkeep:actor/config@0.2.0";
import * as witOutbox from "wasmkeep:actor/outbox@0.2.0";
import type * as wit from "wasmkeep:actor/types@0.2.0";
import { utf8Decode, utf8Encode } from "./web";

/** Bytes of a string (UTF-8) or the bytes themselves. */
export type Bytes = Uint8Array | string;

function bytes(b: Bytes | undefined): Uint8Array {
  if (b === undefined) return new Uint8Array(0);
  return typeof b === "string" ? utf8Encode(b) : b;
}

// ---------------------------------------------------------------- errors

/**
 * An error with a stable, machine-readable `code` and a message for
 * people; it crosses the boundary in both directions.
 *
 * Thrown from a request handler, the client gets 400 for `bad_request`,
 * 404 for `not_found`, 409 for `conflict`, and 500 `guest_error` (with your
 * code and message) for any other code; the event's writes roll back, as
 * for anything thrown. Every host call throws one on failure (`sql_error`,
 * `value_too_large`, ...).
 *
 * @example
 * ```ts
 * throw WasmkeepError.badRequest("`at_ms` is required");
 * ```
 */
export class WasmkeepError extends Error {
  /** The stable code, e.g. `bad_request`. */
  readonly code: string;

  constructor(code: string, message: string) {
    super(message);
    this.code = code;
    this.name = "WasmkeepError";
  }

  /** The request was at fault: 400 `bad_request`. */
  static badRequest(message: string): WasmkeepError {
    return new WasmkeepError("bad_request", message);
  }

  /** Something the request named does not exist: 404 `not_found`. */
  static notFound(message: string): WasmkeepError {
    return new WasmkeepError("not_found", message);
  }

  /** The request conflicts with the actor's state: 409 `conflict`. */
  static conflict(message: string): WasmkeepError {
    return new WasmkeepError("conflict", message);
  }

  /** The WIT error record (what the node receives). */
  get record(): wit.Error {
    return { code: this.code, message: this.message };
  }
}

/** Runs a host call, turning its `err` (the error record, thrown) into a {@link WasmkeepError}. */
function host<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    throw hostError(e);
  }
}

/** What a failed host call throws: its error record as a {@link WasmkeepError}. */
function hostError(e: unknown): unknown {
  const r = e as Partial<wit.Error> | null;
  if (r !== null && typeof r === "object" && typeof r.code === "string" && !(e instanceof Error)) {
    return new WasmkeepError(r.code, String(r.message ?? ""));
  }
  return e;
}

// ---------------------------------------------------------------- http

/**
 * An HTTP request addressed to one actor. `path` is what follows
 * `/v1/{tenant}/{app}/{class}/{name}`, starting with `/`.
 */
export class Request {
  /** Upper-case method: `GET`, `POST`, ... */
  readonly method: string;
  /** The path after the actor's address, starting with `/`. */
  readonly path: string;
  /** The raw query string without `?`, empty if none. */
  readonly query: string;
  readonly #rawHeaders: Array<[string, string]>;
  #headers: ReadonlyArray<readonly [string, string]> | undefined;
  /** The body's bytes. */
  readonly body: Uint8Array;
  #params: URLSearchParams | undefined;

  constructor(r: wit.Request) {
    this.method = r.method;
    this.path = r.path;
    this.query = r.query;
    this.#rawHeaders = r.headers;
    this.body = r.body;
  }

  /** The headers, names in lower case, in the order they came. */
  get headers(): ReadonlyArray<readonly [string, string]> {
    this.#headers ??= this.#rawHeaders.map(([k, v]) => [k.toLowerCase(), v] as const);
    return this.#headers;
  }

  /** `"METHOD /path"`, for a `switch`: `case "POST /increment":`. */
  get route(): string {
    return `${this.method} ${this.path}`;
  }

  /** The first header named `name` (any case), if any. */
  header(name: string): string | undefined {
    const n = name.toLowerCase();
    return this.headers.find(([k]) => k === n)?.[1];
  }

  /** The body as UTF-8 text. */
  text(): string {
    return utf8Decode(this.body);
  }

  /**
   * The body as JSON. Throws `bad_request` (the client gets 400) when it
   * is not JSON.
   */
  json<T = unknown>(): T {
    try {
      return JSON.parse(this.text()) as T;
    } catch (e) {
      throw WasmkeepError.badRequest(`the body is not JSON: ${(e as Error).message}`);
    }
  }

  /** The query parameter `name`, decoded, if present. */
  queryParam(name: string): string | undefined {
    this.#params ??= new URLSearchParams(this.query);
    return this.#params.get(name) ?? undefined;
  }

  /**
   * The query parameter `name` as a non-negative integer, if present;
   * `bad_request` if it is present and not one.
   */
  queryInt(name: string): number | undefined {
    const v = this.queryParam(name);
    if (v === undefined) return undefined;
    if (!/^[0-9]{1,16}$/.test(v) || !Number.isSafeInteger(Number(v))) {
      throw WasmkeepError.badRequest(`query parameter \`${name}\` must be a non-negative integer, got \`${v}\``);
    }
    return Number(v);
  }
}

/** A response: a status, headers and a body. */
export class Response {
  status: number;
  headers: Array<[string, string]>;
  body: Uint8Array;

  constructor(status: number, headers: Array<[string, string]> = [], body: Bytes = new Uint8Array(0)) {
    this.status = status;
    this.headers = headers;
    this.body = bytes(body);
  }

  /** `value` as JSON (`content-type: application/json`). */
  static json(value: unknown, status = 200): Response {
    return new Response(status, [["content-type", "application/json"]], JSON.stringify(value));
  }

  /** `text` as `text/plain; charset=utf-8`. */
  static text(text: string, status = 200): Response {
    return new Response(status, [["content-type", "text/plain; charset=utf-8"]], text);
  }

  /** A response with no body. */
  static status(status: number): Response {
    return new Response(status);
  }

  /** The conventional 404 for a path the actor does not serve: the node's own body for it, code `route_not_found`. */
  static notFound(): Response {
    return Response.json({ error: { code: "route_not_found", message: "no such route" } }, 404);
  }

  /** Adds a header; returns the response, for chaining. */
  header(name: string, value: string): Response {
    this.headers.push([name, value]);
    return this;
  }
}

// ---------------------------------------------------------------- sql

/**
 * What a SQL parameter may be: a number binds as an integer when it is
 * one, else as a real; a bigint must be within 2^53.
 */
export type SqlValue = null | number | bigint | string | Uint8Array | boolean;
/**
 * A row, column name to value. Integers come as numbers, exact up to
 * 2^53 (a JavaScript number's range): keep larger ones as TEXT.
 */
export type Row = Record<string, SqlValue>;

function toValue(v: SqlValue | undefined): wit.Value {
  if (v === null || v === undefined) return { tag: "null" };
  switch (typeof v) {
    case "number":
      return Number.isInteger(v) ? { tag: "integer", val: v } : { tag: "real", val: v };
    case "bigint":
      if (v < -9007199254740991n || v > 9007199254740991n) {
        throw new WasmkeepError("invalid_value", `the integer ${v} is beyond 2^53: bind it as TEXT`);
      }
      return { tag: "integer", val: Number(v) };
    case "string":
      return { tag: "text", val: v };
    case "boolean":
      return { tag: "integer", val: v ? 1 : 0 };
    default:
      if (v instanceof Uint8Array) return { tag: "blob", val: v };
      throw WasmkeepError.badRequest(`a SQL parameter must be null, a number, bigint, string, boolean or Uint8Array, got ${typeof v}`);
  }
}

/** Whether two SQLite values are the same, type and value. */
function sameValue(a: wit.Value, b: wit.Value): boolean {
  if (a.tag !== b.tag) return false;
  if (a.tag === "null") return true;
  const x = (a as { val: unknown }).val;
  const y = (b as { val: unknown }).val;
  if (x instanceof Uint8Array && y instanceof Uint8Array) {
    return x.length === y.length && x.every((byte, i) => byte === y[i]);
  }
  return x === y;
}

function fromValue(v: wit.Value): SqlValue {
  switch (v.tag) {
    case "null":
      return null;
    default:
      return v.val;
  }
}

/**
 * The rows of one statement. Iterate it, or take them all with
 * {@link Cursor.toArray}, one with {@link Cursor.one}, or as arrays with
 * {@link Cursor.raw}. The rows cross from the node in one piece, bounded
 * by the node's limits; page large tables with `LIMIT` and a key.
 */
export class Cursor<T extends Row = Row> implements Iterable<T> {
  /** The result's column names, in order. */
  readonly columnNames: string[];
  /** Rows the statement returned, as the node counts them (`rows-read`). */
  readonly rowsRead: number;
  /** Rows the statement wrote. */
  readonly rowsWritten: number;
  readonly #rows: wit.Value[][];
  #next = 0;

  constructor(r: witSql.QueryResult) {
    this.columnNames = r.columns;
    this.rowsRead = Number(r.rowsRead);
    this.rowsWritten = Number(r.rowsWritten);
    this.#rows = r.rows;
  }

  #row(values: wit.Value[]): T {
    const row: Row = {};
    for (let i = 0; i < this.columnNames.length; i++) row[this.columnNames[i]] = fromValue(values[i]);
    return row as T;
  }

  /** The next row, or undefined after the last. */
  next(): IteratorResult<T> {
    if (this.#next >= this.#rows.length) return { done: true, value: undefined };
    return { done: false, value: this.#row(this.#rows[this.#next++]) };
  }

  [Symbol.iterator](): Iterator<T> {
    return this;
  }

  /** The remaining rows. */
  toArray(): T[] {
    const out: T[] = [];
    for (const r of this) out.push(r);
    return out;
  }

  /** The only row; `sql_error` if there is none or more than one. */
  one(): T {
    if (this.#rows.length !== 1) {
      throw new WasmkeepError("sql_error", `expected exactly one row, got ${this.#rows.length}`);
    }
    return this.#row(this.#rows[0]);
  }

  /** The remaining rows as arrays of values, in column order. */
  raw(): SqlValue[][] {
    const out = this.#rows.slice(this.#next).map((r) => r.map(fromValue));
    this.#next = this.#rows.length;
    return out;
  }
}

const NO_VALUES: wit.Value[] = [];

/**
 * SQL over the actor's own database. Statements take positional
 * parameters (`?1`, `?2`, ... or `?`). The node's own tables are
 * invisible; ATTACH, transaction control and pragmas that change
 * durability are refused (`sql_error`, `forbidden`).
 */
export const sql = {
  /**
   * Runs any statement and returns its rows (none for a statement
   * without a result), as Durable Objects' `sql.exec` does.
   *
   * @example
   * ```ts
   * for (const note of sql.exec<{ id: number; title: string }>("SELECT id, title FROM notes WHERE id > ?", 10)) {
   *   log.info(note.title);
   * }
   * ```
   */
  exec<T extends Row = Row>(statement: string, ...params: SqlValue[]): Cursor<T> {
    const values = params.length === 0 ? NO_VALUES : params.map(toValue);
    try {
      return new Cursor<T>(witSql.query(statement, values));
    } catch (e) {
      throw hostError(e);
    }
  },

  /** The only row of a statement (see {@link Cursor.one}). */
  one<T extends Row = Row>(statement: string, ...params: SqlValue[]): T {
    return sql.exec<T>(statement, ...params).one();
  },

  /**
   * Applies a decision only if the record it was taken on is unchanged,
   * as the Rust SDK's `sql::apply_if_unchanged`: `read` (one row, one
   * column: a generation, a version, a state) must still give `seen`, or
   * `apply` does not run and this returns false. A missing row reads as
   * NULL; values compare by type and value (an integer is not a real).
   * The decision and its inputs may be an event apart: a send records
   * `seen` in its context, and the answer's event applies only if
   * nothing moved the record meanwhile (the second seed's stale timeout).
   *
   * @example
   * ```ts
   * const applied = sql.applyIfUnchanged("SELECT generation FROM rings WHERE booking = ?1", ["b-17"], 3, () => {
   *   sql.run("UPDATE rings SET state = 'timeout' WHERE booking = ?1", "b-17");
   * });
   * ```
   */
  applyIfUnchanged(read: string, params: SqlValue[], seen: SqlValue, apply: () => void): boolean {
    const values = params.map(toValue);
    let now: wit.Value;
    try {
      now = witSql.query(read, values).rows[0]?.[0] ?? { tag: "null" };
    } catch (e) {
      throw hostError(e);
    }
    if (!sameValue(now, toValue(seen))) return false;
    apply();
    return true;
  },

  /**
   * Runs a statement that returns no rows; returns how many rows it
   * changed and the last inserted rowid.
   */
  run(statement: string, ...params: SqlValue[]): { rowsWritten: number; lastInsertRowid: number } {
    const values = params.map(toValue);
    const r = host(() => witSql.execute(statement, values));
    return { rowsWritten: Number(r.rowsWritten), lastInsertRowid: Number(r.lastInsertRowid) };
  },
};

// ---------------------------------------------------------------- kv

/** Which keys {@link kv.list} returns. */
export interface ListOptions {
  /** Only keys starting with this. */
  prefix?: string;
  /** Only keys >= this. */
  start?: string;
  /** Only keys < this. */
  end?: string;
  /** At most this many (the node caps it too). */
  limit?: number;
  /** Descending key order. */
  reverse?: boolean;
}

/**
 * A sorted key-value store in the actor's database: string keys (sorted by
 * their UTF-8 bytes), byte values, with text and JSON helpers.
 */
export const kv = {
  /** The value of `key`, if any. */
  get(key: string): Uint8Array | undefined {
    return host(() => witKv.get(key)) ?? undefined;
  },
  /** The value of `key` as UTF-8 text, if any. */
  getText(key: string): string | undefined {
    const v = kv.get(key);
    return v === undefined ? undefined : utf8Decode(v);
  },
  /** The value of `key` parsed as JSON, if any; `invalid_value` if it is not JSON. */
  getJson<T>(key: string): T | undefined {
    const v = kv.getText(key);
    if (v === undefined) return undefined;
    try {
      return JSON.parse(v) as T;
    } catch (e) {
      throw new WasmkeepError("invalid_value", `kv key \`${key}\` does not hold JSON: ${(e as Error).message}`);
    }
  },
  /** Sets `key` to `value` (text is stored as UTF-8). */
  put(key: string, value: Bytes): void {
    const v = bytes(value);
    host(() => witKv.put(key, v));
  },
  /** Sets `key` to `value` as JSON. */
  putJson(key: string, value: unknown): void {
    kv.put(key, JSON.stringify(value));
  },
  /** Deletes `key`; returns whether it existed. */
  delete(key: string): boolean {
    return host(() => witKv.delete(key));
  },
  /** The entries the options select, in key order. */
  list(options: ListOptions = {}): Array<[string, Uint8Array]> {
    return host(() =>
      witKv.list({
        prefix: options.prefix ?? null,
        start: options.start ?? null,
        end: options.end ?? null,
        limit: options.limit ?? null,
        reverse: options.reverse ?? false,
      }),
    );
  },
};

// ---------------------------------------------------------------- alarm, time, identity

/** What the node knows about an alarm it delivers. */
export interface AlarmInfo {
  /** How many earlier attempts at this alarm failed. */
  retryCount: number;
  /** Whether this delivery is a retry. */
  isRetry: boolean;
  /** When this attempt was due, unix milliseconds. */
  scheduledMs: number;
}

/** The actor's single alarm (times in unix milliseconds). */
export const alarm = {
  /** Sets or replaces the alarm; a time in the past fires once the event commits. */
  set(atMs: number): void {
    if (!Number.isSafeInteger(atMs) || atMs < 0) {
      throw WasmkeepError.badRequest(`an alarm time is a non-negative integer of unix milliseconds, got ${atMs}`);
    }
    host(() => witAlarm.setAlarm(atMs));
  },
  /** The pending alarm (inside the alarm handler: none unless it set a new one). */
  get(): number | undefined {
    return witAlarm.getAlarm() ?? undefined;
  },
  /** Clears the alarm. */
  delete(): void {
    witAlarm.deleteAlarm();
  },
};

/** The node's time, unix milliseconds (a test kit controls it). */
export function nowMs(): number {
  return witClock.nowMs();
}

/** Who this actor is. */
export interface ActorId {
  tenant: string;
  app: string;
  class: string;
  name: string;
}

/** This actor's address. */
export function id(): ActorId {
  return witIdentity.id();
}

/** Lines in the node's log, with the actor's address. */
export const log = {
  trace: (message: string): void => witLog.log("trace", message),
  debug: (message: string): void => witLog.log("debug", message),
  info: (message: string): void => witLog.log("info", message),
  warn: (message: string): void => witLog.log("warn", message),
  error: (message: string): void => witLog.log("error", message),
};

/**
 * The app's configuration: a secret an operator set, else a variable of
 * the manifest's `[vars]`. A secret's value never shows in the node's
 * logs (a log line holding one has it replaced).
 */
export const config = {
  /** The secret or variable `name`, if any. */
  get(name: string): string | undefined {
    return witConfig.get(name) ?? undefined;
  },
};

// ---------------------------------------------------------------- timers

/** A pending (or, from {@link timers.takeDue}, due) timer. */
export interface Timer {
  /** Unique in the actor. */
  name: string;
  /** Unix milliseconds. */
  dueMs: number;
  /** What {@link timers.set} attached. */
  payload: Uint8Array;
}

/**
 * Named timers on the one alarm (ADR 0039), the same table and rules as
 * the Rust SDK's `timers`: the alarm is kept at the earliest timer; an
 * alarm handler calls {@link timers.takeDue}, and what it took fires
 * again if the handler throws (the runtime retries the alarm).
 */
export const timers = {
  /** Most timers one actor keeps. */
  TIMERS_MAX: 10_000,
  /** Longest name, in UTF-8 bytes. */
  NAME_BYTES_MAX: 256,
  /** Largest payload, in bytes. */
  PAYLOAD_BYTES_MAX: 64 * 1024,
  /** Most timers one {@link timers.takeDue} returns (the alarm re-arms at once for the rest). */
  DUE_PER_RUN_MAX: 1_000,

  /** Sets (or moves, replacing its payload) the timer `name` to fire at `dueMs`. */
  set(name: string, dueMs: number, payload: Bytes = new Uint8Array(0)): void {
    const nameBytes = utf8Encode(name).length;
    if (nameBytes === 0 || nameBytes > timers.NAME_BYTES_MAX) {
      throw new WasmkeepError("invalid_timer", `a timer name is 1 to ${timers.NAME_BYTES_MAX} bytes (name_bytes_max): got ${nameBytes}`);
    }
    const p = bytes(payload);
    if (p.length > timers.PAYLOAD_BYTES_MAX) {
      throw new WasmkeepError("invalid_timer", `timer \`${name}\`: payload of ${p.length} bytes is over payload_bytes_max=${timers.PAYLOAD_BYTES_MAX}`);
    }
    if (!Number.isSafeInteger(dueMs) || dueMs < 0) {
      throw new WasmkeepError("invalid_timer", `timer \`${name}\`: due_ms=${dueMs} is out of range`);
    }
    ensureTimers();
    const exists = sql.exec("SELECT 1 FROM wasmkeep_sdk_timers WHERE name = ?1", name).raw().length > 0;
    if (!exists && (sql.one<{ n: number }>("SELECT count(*) AS n FROM wasmkeep_sdk_timers").n as number) >= timers.TIMERS_MAX) {
      throw new WasmkeepError("too_many_timers", `the actor already has timers_max=${timers.TIMERS_MAX} timers: cancel one first`);
    }
    sql.run("INSERT OR REPLACE INTO wasmkeep_sdk_timers (name, due_ms, payload) VALUES (?1, ?2, ?3)", name, dueMs, p);
    rearmUnlessInAlarm();
  },

  /** Cancels the timer `name`; returns whether there was one. */
  cancel(name: string): boolean {
    ensureTimers();
    const n = sql.run("DELETE FROM wasmkeep_sdk_timers WHERE name = ?1", name).rowsWritten;
    rearmUnlessInAlarm();
    return n > 0;
  },

  /** The timer `name`, if it is pending. */
  get(name: string): Timer | undefined {
    ensureTimers();
    const r = sql.exec("SELECT name, due_ms, payload FROM wasmkeep_sdk_timers WHERE name = ?1", name).raw()[0];
    return r === undefined ? undefined : timer(r);
  },

  /** Every pending timer, earliest first (ties by name). */
  list(): Timer[] {
    ensureTimers();
    return sql.exec("SELECT name, due_ms, payload FROM wasmkeep_sdk_timers ORDER BY due_ms, name").raw().map(timer);
  },

  /** Removes and returns the timers due at `now` (earliest first, at most DUE_PER_RUN_MAX). */
  takeDue(now: number = nowMs()): Timer[] {
    ensureTimers();
    const due = sql
      .exec(
        "DELETE FROM wasmkeep_sdk_timers WHERE name IN (SELECT name FROM wasmkeep_sdk_timers WHERE due_ms <= ?1 ORDER BY due_ms, name LIMIT ?2) RETURNING name, due_ms, payload",
        now,
        timers.DUE_PER_RUN_MAX,
      )
      .raw()
      .map(timer);
    due.sort((a, b) => a.dueMs - b.dueMs || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    rearmUnlessInAlarm();
    return due;
  },
};

/** An alarm run is under way: re-arm after it, not during it. */
let inAlarm = false;
/** This run used the timers: re-arm after it. */
let timersTouched = false;

function ensureTimers(): void {
  timersTouched = true;
  sql.run("CREATE TABLE IF NOT EXISTS wasmkeep_sdk_timers (name TEXT PRIMARY KEY, due_ms INTEGER NOT NULL, payload BLOB NOT NULL) WITHOUT ROWID");
  sql.run("CREATE INDEX IF NOT EXISTS wasmkeep_sdk_timers_due ON wasmkeep_sdk_timers (due_ms, name)");
}

function timer(r: SqlValue[]): Timer {
  return { name: r[0] as string, dueMs: Number(r[1]), payload: r[2] as Uint8Array };
}

function rearmUnlessInAlarm(): void {
  if (!inAlarm) rearm();
}

function rearm(): void {
  const due = sql.exec("SELECT min(due_ms) FROM wasmkeep_sdk_timers").raw()[0]?.[0];
  if (due === null || due === undefined) {
    alarm.delete();
  } else if (alarm.get() !== Number(due)) {
    alarm.set(Number(due));
  }
}

// ---------------------------------------------------------------- outbox

/** Another actor of this tenant. */
export interface Address {
  app: string;
  class: string;
  name: string;
}

/** The actor `class/name` of this app. */
export function to(cls: string, name: string): Address {
  return { app: id().app, class: cls, name };
}

/** An outbound HTTP call. Only hosts the app's manifest allows are reached. */
export interface HttpCall {
  /** Upper-case method (default `GET`). */
  method?: string;
  /** `http://` or `https://` URL. */
  url: string;
  headers?: Array<[string, string]>;
  body?: Bytes;
  /** Per attempt; the app's `timeout_ms` when absent, and never more. */
  timeoutMs?: number;
}

/** A message from another actor, for {@link Actor.message}. */
export interface Message {
  /** The sender, of this tenant. */
  from: Address;
  /** The sender's sequence number of this message. */
  seq: number;
  body: Uint8Array;
  /** The body as UTF-8 text. */
  text(): string;
}

/** How a send or call ended, for {@link Actor.response}. */
export type Answer =
  /** The other actor's `message` returned these bytes. */
  | { kind: "reply"; body: Uint8Array }
  /** The other actor's `message` threw (its event rolled back). */
  | { kind: "refused"; error: WasmkeepError }
  /** The HTTP call was answered (any status). */
  | { kind: "http"; status: number; headers: Array<[string, string]>; body: Uint8Array }
  /** Never delivered, for good: no such actor or host, a policy refusal, or every attempt failed. */
  | { kind: "failed"; error: WasmkeepError };

/** The answer to a send or call, with the context it carried. */
export interface OutboxResponse<C = unknown> {
  /** What `send` or `fetch` returned. */
  seq: number;
  /** The context the send carried (the value given to `send`/`fetch`, through JSON). */
  context: C;
  answer: Answer;
  /** Deliveries tried (1 when the first worked). */
  attempts: number;
}

/**
 * Messages to other actors and calls to the outside world (ADR 0040).
 * Nothing leaves before the event commits, nothing leaves for an event
 * that rolls back; the answer comes back as an {@link Actor.response}
 * event carrying `context` (any JSON value). This is how a handler talks
 * to the network: it never awaits it.
 */
export const outbox = {
  /** Sends `body` to actor `to`; returns the message's sequence number. */
  send<C = unknown>(target: Address, body: Bytes, context?: C): number {
    const b = bytes(body);
    const c = contextBytes(context);
    return host(() => witOutbox.send(target, b, c));
  },
  /** Makes an HTTP call; each attempt carries `idempotency-key`. Returns its sequence number. */
  fetch<C = unknown>(call: HttpCall, context?: C): number {
    const c = contextBytes(context);
    const wc: witOutbox.HttpCall = {
      method: call.method ?? "GET",
      url: call.url,
      headers: call.headers ?? [],
      body: bytes(call.body),
      timeoutMs: call.timeoutMs ?? null,
    };
    return host(() => witOutbox.fetch(wc, c));
  },
};

function contextBytes(context: unknown): Uint8Array {
  return context === undefined ? new Uint8Array(0) : utf8Encode(JSON.stringify(context));
}

function contextValue(b: Uint8Array): unknown {
  if (b.length === 0) return undefined;
  try {
    return JSON.parse(utf8Decode(b));
  } catch {
    return b;
  }
}

// ---------------------------------------------------------------- replies

/**
 * Replies that wait (ADR 0042): park the reply to the request being
 * handled, and complete it from a later event of the same actor.
 */
export const replies = {
  /** Parks this request's reply for at most `timeoutMs`; returns its ticket (keep it in the database or a send's context, as a string). */
  park(timeoutMs: number): string {
    return String(host(() => witReplies.park(timeoutMs)));
  },
  /** Completes a reply this actor parked; it leaves once this event commits. */
  complete(ticket: string, response: Response): void {
    const t = Number(ticket);
    if (!Number.isSafeInteger(t)) throw new WasmkeepError("reply_not_found", `\`${ticket}\` is not a ticket`);
    host(() => witReplies.complete(t, response.status, response.headers, response.body));
  },
};

// ---------------------------------------------------------------- sockets

/** A socket message: text, or bytes for a binary one. */
export type SocketMessage = string | Uint8Array;

/** One of the actor's sockets. */
export interface SocketInfo {
  id: number;
  tags: string[];
  /** What the actor attached (survives hibernation). */
  attachment: Uint8Array;
}

function toMessage(m: SocketMessage): witSockets.Message {
  return typeof m === "string" ? { tag: "text", val: m } : { tag: "binary", val: m };
}

/**
 * WebSockets (ADR 0043). The node holds the connections: between events
 * the actor may be closed while its sockets stay open. Sends and closes
 * happen once the event commits.
 */
export const sockets = {
  /** Accepts this request's WebSocket upgrade (answer it with `Response.status(101)`). */
  accept(tags: string[] = [], attachment: Bytes = new Uint8Array(0)): number {
    const a = bytes(attachment);
    return host(() => witSockets.accept(tags, a));
  },
  /** Sends to one socket. */
  send(socket: number, message: SocketMessage): void {
    host(() => witSockets.send(socket, toMessage(message)));
  },
  /** Sends to every socket with `tag` (every socket with none); returns how many. */
  broadcast(tag: string | undefined, message: SocketMessage): number {
    return host(() => witSockets.broadcast(tag ?? null, toMessage(message)));
  },
  /** Closes a socket. */
  close(socket: number, code = 1000, reason = ""): void {
    host(() => witSockets.close(socket, code, reason));
  },
  /** The open sockets (with `tag`: only those). */
  list(tag?: string): SocketInfo[] {
    return witSockets.list(tag ?? null);
  },
  /** Replaces a socket's attachment, at once. */
  setAttachment(socket: number, attachment: Bytes): void {
    const a = bytes(attachment);
    host(() => witSockets.setAttachment(socket, a));
  },
  /** A text message the node answers itself without waking the actor (undefined: off). */
  setAutoResponse(pair: [string, string] | undefined): void {
    host(() => witSockets.setAutoResponse(pair ?? null));
  },
};

// ---------------------------------------------------------------- actors and the app

/**
 * One class of actors. An object of the class is made when an actor of it
 * first runs in an instance, and may live across events; the database is
 * the actor's state, fields are only a cache.
 */
export interface Actor {
  /** The first event of a new actor runs this first, in the same transaction. */
  init?(): void;
  /** Handles a request. */
  request(req: Request): Response;
  /** The alarm fired. Throwing makes the node retry it with backoff. */
  alarm?(info: AlarmInfo): void;
  /** A message from another actor; what it returns is the sender's answer. */
  message?(msg: Message): Bytes;
  /** The answer to a send or call of this actor. */
  response?(r: OutboxResponse): void;
  /** A message on one of the actor's sockets. */
  socketMessage?(socket: SocketInfo, message: SocketMessage): void;
  /** A socket closed. */
  socketClose?(socket: SocketInfo, code: number, reason: string): void;
}

/** A class the app serves. */
export type ActorClass = new () => Actor;

/** What {@link app} returns: the component's exports. Export it as the module's default. */
export interface App {
  handler: object;
  inbox: object;
  socketHandler: object;
}

const ASYNC_REFUSED =
  "a wasmkeep handler is synchronous and may not return a Promise: no event holds its actor while it waits on the network. Send through `outbox` and handle the answer in `response` (see docs/typescript.md)";

/** Refuses a handler that returned a Promise (an `async` method). */
function sync<T>(v: T): T {
  if (v !== null && typeof v === "object" && typeof (v as { then?: unknown }).then === "function") {
    throw new WasmkeepError("async_handler", ASYNC_REFUSED);
  }
  return v;
}

/** Runs an export: a {@link WasmkeepError} becomes the WIT error, anything else `guest_error`. */
function run<T>(f: () => T): T {
  try {
    return f();
  } catch (e) {
    // An export returns `err` by throwing the error record itself.
    if (e instanceof WasmkeepError) throw e.record;
    const err = e instanceof Error ? e : new Error(String(e));
    witLog.log("error", `uncaught ${err.name}: ${err.message}${err.stack ? `\n${err.stack}` : ""}`);
    throw { code: "guest_error", message: `${err.name}: ${err.message}` };
  }
}

function answer(a: unknown): Answer {
  const v = a as { tag: string; val: unknown };
  const err = (e: wit.Error) => new WasmkeepError(e.code, e.message);
  switch (v.tag) {
    case "reply":
      return { kind: "reply", body: v.val as Uint8Array };
    case "refused":
      return { kind: "refused", error: err(v.val as wit.Error) };
    case "http": {
      const h = v.val as { status: number; headers: Array<[string, string]>; body: Uint8Array };
      return { kind: "http", status: h.status, headers: h.headers, body: h.body };
    }
    default:
      return { kind: "failed", error: err(v.val as wit.Error) };
  }
}

/**
 * The app: each class name (`[a-z0-9][a-z0-9_-]*`, at most 63 bytes) and
 * its class. Export the result as the module's default; `wasmkeep build`
 * makes the component from it.
 */
export function app(classes: Record<string, ActorClass>): App {
  const names = Object.keys(classes);
  const objects = new Map<string, Actor>();
  const actor = (cls: string): Actor => {
    let a = objects.get(cls);
    if (a === undefined) {
      const C = classes[cls];
      if (C === undefined) throw new WasmkeepError("class_not_found", `this app has no class \`${cls}\``);
      a = new C();
      objects.set(cls, a);
    }
    return a;
  };
  const handler = {
    classes: (): string[] => names,
    onInit: (cls: string): void => run(() => void sync(actor(cls).init?.())),
    onRequest: (cls: string, r: wit.Request): number =>
      run(() => {
        const res = sync(actor(cls).request(new Request(r)));
        if (!(res instanceof Response)) {
          throw new WasmkeepError("guest_error", "a request handler must return a Response");
        }
        try {
          const h = res.headers;
          for (let i = 0; i < h.length; i++) witResponse.addHeader(h[i][0], h[i][1]);
          if (res.body.length > 0) witResponse.writeBody(res.body);
        } catch (e) {
          throw hostError(e);
        }
        return res.status;
      }),
    onAlarm: (cls: string, info: wit.AlarmInfo): void =>
      run(() => {
        inAlarm = true;
        timersTouched = false;
        try {
          const a = actor(cls);
          const i = { retryCount: info.retryCount, isRetry: info.isRetry, scheduledMs: info.scheduledMs };
          if (a.alarm) sync(a.alarm(i));
        } finally {
          inAlarm = false;
        }
        if (timersTouched) rearm();
        timersTouched = false;
      }),
  };
  const inbox = {
    onMessage: (cls: string, m: { from: Address; seq: number; body: Uint8Array }): Uint8Array =>
      run(() => {
        const a = actor(cls);
        if (!a.message) throw new WasmkeepError("no_handler", "this class does not handle messages");
        const msg: Message = { from: m.from, seq: m.seq, body: m.body, text: () => utf8Decode(m.body) };
        return bytes(sync(a.message(msg)));
      }),
    onResponse: (cls: string, r: { seq: number; context: Uint8Array; answer: unknown; attempts: number }): void =>
      run(() => {
        const a = actor(cls);
        if (a.response) {
          sync(a.response({ seq: r.seq, context: contextValue(r.context), answer: answer(r.answer), attempts: r.attempts }));
        }
      }),
  };
  const socketHandler = {
    onSocketMessage: (cls: string, s: SocketInfo, m: witSockets.Message): void =>
      run(() => void sync(actor(cls).socketMessage?.(s, m.val))),
    onSocketClose: (cls: string, s: SocketInfo, code: number, reason: string): void =>
      run(() => void sync(actor(cls).socketClose?.(s, code, reason))),
  };
  return { handler, inbox, socketHandler };
}

// A handler never waits on the network; `fetch` says what to do instead.
(globalThis as { fetch?: unknown }).fetch = (): never => {
  throw new WasmkeepError(
    "fetch_unsupported",
    "`fetch` is not available in a wasmkeep actor: a handler never waits on the network. Use `outbox.fetch(call, context)` and handle the answer in `response` (see docs/typescript.md)",
  );
};

// Time is the node's (a test kit's clock moves it): `Date.now()` and
// `new Date()` read the same clock as `nowMs()`. The component has no
// clock of its own (its WASI clocks are off).
{
  const HostDate = globalThis.Date;
  class NodeDate extends HostDate {
    constructor(...args: unknown[]) {
      if (args.length === 0) super(nowMs());
      else super(...(args as [string | number | Date]));
    }
    static now(): number {
      return nowMs();
    }
  }
  globalThis.Date = NodeDate as DateConstructor;
}
