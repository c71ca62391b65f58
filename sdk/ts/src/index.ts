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
import * as witCron from "wasmkeep:actor/cron@0.2.0";
import * as witBookmarks from "wasmkeep:actor/bookmarks@0.2.0";
import * as witLog from "wasmkeep:actor/log@0.2.0";
import * as witResponse from "wasmkeep:actor/response@0.2.0";
import * as witReplies from "wasmkeep:actor/replies@0.2.0";
import * as witSockets from "wasmkeep:actor/sockets@0.2.0";
import * as witConfig from "wasmkeep:actor/config@0.2.0";
import * as witOutbox from "wasmkeep:actor/outbox@0.2.0";
import * as witAwaits from "wasmkeep:actor/awaits@0.2.0";
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
  // The record comes thrown as it is, or (for some result types) as the
  // `payload` of an Error.
  const payload = e instanceof Error ? (e as Error & { payload?: unknown }).payload : e;
  const r = payload as Partial<wit.Error> | null | undefined;
  if (r !== null && r !== undefined && typeof r === "object" && typeof r.code === "string" && !(r instanceof Error)) {
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

  /**
   * The database's size in bytes (pages in use times the page size): what
   * counts against the node's `database_bytes_max`, SQL tables, key-value
   * pairs and the SDK's own tables alike (Durable Objects' `databaseSize`).
   */
  databaseSize(): number {
    return Number(witSql.databaseSize());
  },
};

// ---------------------------------------------------------------- schema

const SCHEMA_CREATE =
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_schema (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL)";

/**
 * Schema migrations (issue 38), as the Rust SDK's `schema` module: a
 * class lists SQL statements in a static `migrations` array, oldest
 * first, and before each of its events the SDK runs those the actor's
 * database has not had, in that event's transaction, before `init` or
 * the handler. A failing one fails the event with `migration_failed`
 * naming it, and everything rolls back: the actor stays on its old
 * schema. Only ever append to the list. A database that has had more
 * migrations than the running build lists (after a rollback) is left as
 * it is. Cost: one `SELECT` per event of a class that lists migrations.
 *
 * @example
 * ```ts
 * class Notes implements Actor {
 *   static migrations = [
 *     "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL)",
 *     "ALTER TABLE notes ADD COLUMN body TEXT NOT NULL DEFAULT ''",
 *   ];
 *   request(req: Request): Response {
 *     return Response.json({ schema: schema.version() });
 *   }
 * }
 * ```
 */
export const schema = {
  /** How many migrations this actor's database has had (0 before any). */
  version(): number {
    try {
      const row = witSql.query("SELECT version FROM wasmkeep_sdk_schema WHERE id = 0", NO_VALUES).rows[0];
      const v = row?.[0];
      return v !== undefined && v.tag === "integer" ? Number(v.val) : 0;
    } catch (e) {
      const err = hostError(e);
      if (err instanceof WasmkeepError && err.message.includes("no such table")) return 0;
      throw err;
    }
  },
};

/** Runs the migrations the database has not had (before each event of a class that lists any). */
function migrate(migrations: readonly string[]): void {
  const n = migrations.length;
  const at = schema.version();
  if (at >= n) return;
  sql.run(SCHEMA_CREATE);
  for (let i = at; i < n; i++) {
    try {
      sql.run(migrations[i]);
    } catch (e) {
      const err = e instanceof WasmkeepError ? `${e.code}: ${e.message}` : String(e);
      throw new WasmkeepError(
        "migration_failed",
        `migration ${i + 1} of ${n} failed, the actor stays at schema version ${at}: ${err}`,
      );
    }
  }
  sql.run(
    "INSERT INTO wasmkeep_sdk_schema (id, version) VALUES (0, ?1) ON CONFLICT (id) DO UPDATE SET version = excluded.version",
    n,
  );
}

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
  /** Deletes every key that starts with `prefix`; returns how many there were. */
  deletePrefix(prefix: string): number {
    return Number(host(() => witKv.deletePrefix(prefix)));
  },
  /**
   * Deletes every key; returns how many there were (tables and the alarm
   * stay: {@link deleteAll} removes everything).
   */
  deleteAll(): number {
    return kv.deletePrefix("");
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

/**
 * A new identifier no other call returns, anywhere: 128 bits from the
 * node's operating system's random source as 32 lowercase hex digits
 * (Durable Objects' `newUniqueId`): the name of a new actor, a row's key.
 */
export function uniqueId(): string {
  return host(() => witIdentity.uniqueId());
}

/**
 * Deletes everything this actor stored, in the event's transaction
 * (Durable Objects' `deleteAll`): every table and view it made (the SDK's
 * own too: timers, cron schedules, workflows, blobs), every key-value
 * pair, and its alarm. The actor goes on existing, empty. Tables that
 * others reference with foreign keys are dropped after them.
 */
export function deleteAll(): void {
  const schema = (kind: string): string[] =>
    sql
      .exec<{ name: string }>(
        "SELECT name FROM sqlite_schema WHERE type = ? AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' " +
          "AND name NOT LIKE '\\_wasmkeep\\_%' ESCAPE '\\'",
        kind,
      )
      .toArray()
      .map((r) => r.name);
  const quote = (name: string): string => `"${name.replace(/"/g, '""')}"`;
  for (const view of schema("view")) sql.run(`DROP VIEW IF EXISTS ${quote(view)}`);
  // A table referenced by another's foreign key may refuse to go first:
  // drop what can go, and go again while each round drops something.
  let left = schema("table");
  while (left.length > 0) {
    const refused: string[] = [];
    let firstError: unknown;
    for (const table of left) {
      try {
        sql.run(`DROP TABLE IF EXISTS ${quote(table)}`);
      } catch (e) {
        firstError ??= e;
        refused.push(table);
      }
    }
    if (refused.length === left.length) throw firstError;
    left = refused;
  }
  kv.deletePrefix("");
  alarm.delete();
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
    const p = bytes(payload);
    checkTimer(name, p);
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

/** The timers' and the cron schedules' tables (they share the alarm), as the Rust SDK's. */
const TIMER_TABLES = [
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_timers (name TEXT PRIMARY KEY, due_ms INTEGER NOT NULL, payload BLOB NOT NULL) WITHOUT ROWID",
  "CREATE INDEX IF NOT EXISTS wasmkeep_sdk_timers_due ON wasmkeep_sdk_timers (due_ms, name)",
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_cron (name TEXT PRIMARY KEY, expression TEXT NOT NULL, zone TEXT NOT NULL, payload BLOB NOT NULL, next_ms INTEGER NOT NULL) WITHOUT ROWID",
  "CREATE INDEX IF NOT EXISTS wasmkeep_sdk_cron_next ON wasmkeep_sdk_cron (next_ms, name)",
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_cron_runs (name TEXT NOT NULL, scheduled_ms INTEGER NOT NULL, ran_ms INTEGER NOT NULL, missed INTEGER NOT NULL, PRIMARY KEY (name, scheduled_ms)) WITHOUT ROWID",
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_workflows (id TEXT PRIMARY KEY, workflow TEXT NOT NULL, state TEXT NOT NULL, step INTEGER NOT NULL, failures INTEGER NOT NULL, wake_ms INTEGER, error TEXT, gen INTEGER NOT NULL, input TEXT NOT NULL, created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL) WITHOUT ROWID",
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_workflow_steps (id TEXT NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL, result TEXT NOT NULL, attempts INTEGER NOT NULL, done_ms INTEGER NOT NULL, PRIMARY KEY (id, step)) WITHOUT ROWID",
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_workflow_events (id TEXT NOT NULL, event TEXT NOT NULL, payload TEXT NOT NULL, PRIMARY KEY (id, event)) WITHOUT ROWID",
];

function ensureTimers(): void {
  timersTouched = true;
  for (const t of TIMER_TABLES) sql.run(t);
}

function checkTimer(name: string, p: Uint8Array): void {
  const nameBytes = utf8Encode(name).length;
  if (nameBytes === 0 || nameBytes > timers.NAME_BYTES_MAX) {
    throw new WasmkeepError("invalid_timer", `a timer name is 1 to ${timers.NAME_BYTES_MAX} bytes (name_bytes_max): got ${nameBytes}`);
  }
  if (p.length > timers.PAYLOAD_BYTES_MAX) {
    throw new WasmkeepError("invalid_timer", `timer \`${name}\`: payload of ${p.length} bytes is over payload_bytes_max=${timers.PAYLOAD_BYTES_MAX}`);
  }
}

function timer(r: SqlValue[]): Timer {
  return { name: r[0] as string, dueMs: Number(r[1]), payload: r[2] as Uint8Array };
}

function rearmUnlessInAlarm(): void {
  if (!inAlarm) rearm();
}

function rearm(): void {
  const due = sql
    .exec(
      "SELECT min(m) FROM (SELECT min(due_ms) AS m FROM wasmkeep_sdk_timers UNION ALL SELECT min(next_ms) FROM wasmkeep_sdk_cron UNION ALL SELECT min(wake_ms) FROM wasmkeep_sdk_workflows WHERE state IN ('sleeping', 'waiting', 'retrying', 'calling'))",
    )
    .raw()[0]?.[0];
  if (due === null || due === undefined) {
    alarm.delete();
  } else if (alarm.get() !== Number(due)) {
    alarm.set(Number(due));
  }
}

// ---------------------------------------------------------------- blobs

const BLOB_TABLES = [
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_blobs (name TEXT PRIMARY KEY, size INTEGER NOT NULL, chunks INTEGER NOT NULL) WITHOUT ROWID",
  "CREATE TABLE IF NOT EXISTS wasmkeep_sdk_blob_chunks (id INTEGER PRIMARY KEY, name TEXT NOT NULL, seq INTEGER NOT NULL, data BLOB NOT NULL)",
  "CREATE UNIQUE INDEX IF NOT EXISTS wasmkeep_sdk_blob_chunks_at ON wasmkeep_sdk_blob_chunks (name, seq)",
];

function ensureBlobs(): void {
  for (const t of BLOB_TABLES) sql.run(t);
}

function blobMeta(name: string): { size: number; chunks: number } | undefined {
  const r = sql.exec("SELECT size, chunks FROM wasmkeep_sdk_blobs WHERE name = ?1", name).raw()[0];
  return r === undefined ? undefined : { size: Number(r[0]), chunks: Number(r[1]) };
}

function blobChunk(name: string, seq: number): Uint8Array {
  const r = sql.exec("SELECT data FROM wasmkeep_sdk_blob_chunks WHERE name = ?1 AND seq = ?2", name, seq).raw()[0];
  if (r === undefined) throw new WasmkeepError("storage_corrupt", `blob \`${name}\`: chunk ${seq} is missing`);
  return r[0] as Uint8Array;
}

function blobMetaOrNotFound(name: string): { size: number; chunks: number } {
  const m = blobMeta(name);
  if (m === undefined) throw WasmkeepError.notFound(`no blob named \`${name}\``);
  return m;
}

/**
 * Values larger than a row, in chunks of the actor's database, with the
 * tables and rules of the Rust SDK's `blobs`: no row is larger than
 * `CHUNK_BYTES`, so the actor opens at any size up to its database limit
 * (`database_full` past it, the event rolled back). Stream in with
 * {@link blobs.append}, out with {@link blobs.chunks}, {@link blobs.read}
 * or {@link blobs.writeResponseBody}.
 */
export const blobs = {
  /** Bytes per stored chunk. */
  CHUNK_BYTES: 64 * 1024,
  /** Longest name, in UTF-8 bytes. */
  NAME_BYTES_MAX: 256,

  /** Replaces the blob `name` with `data`. */
  put(name: string, data: Bytes): void {
    blobs.delete(name);
    const d = bytes(data);
    if (d.length === 0) {
      checkBlobName(name);
      sql.run("INSERT INTO wasmkeep_sdk_blobs (name, size, chunks) VALUES (?1, 0, 0)", name);
      return;
    }
    blobs.append(name, d);
  },

  /** Appends `data` (made if missing); returns the new size. */
  append(name: string, data: Bytes): number {
    checkBlobName(name);
    ensureBlobs();
    let { size, chunks } = blobMeta(name) ?? { size: 0, chunks: 0 };
    let rest = bytes(data);
    const tail = size % blobs.CHUNK_BYTES;
    if (tail > 0 && rest.length > 0) {
      const last = blobChunk(name, chunks - 1);
      const take = Math.min(blobs.CHUNK_BYTES - tail, rest.length);
      const filled = new Uint8Array(last.length + take);
      filled.set(last);
      filled.set(rest.subarray(0, take), last.length);
      sql.run("UPDATE wasmkeep_sdk_blob_chunks SET data = ?3 WHERE name = ?1 AND seq = ?2", name, chunks - 1, filled);
      size += take;
      rest = rest.subarray(take);
    }
    for (let at = 0; at < rest.length; at += blobs.CHUNK_BYTES) {
      const part = rest.slice(at, at + blobs.CHUNK_BYTES);
      sql.run("INSERT INTO wasmkeep_sdk_blob_chunks (name, seq, data) VALUES (?1, ?2, ?3)", name, chunks, part);
      chunks += 1;
      size += part.length;
    }
    sql.run("INSERT OR REPLACE INTO wasmkeep_sdk_blobs (name, size, chunks) VALUES (?1, ?2, ?3)", name, size, chunks);
    return size;
  },

  /** The size in bytes, if the blob exists. */
  size(name: string): number | undefined {
    ensureBlobs();
    return blobMeta(name)?.size;
  },

  /** The whole blob, held in memory (for a large one use chunks, read or writeResponseBody). */
  get(name: string): Uint8Array | undefined {
    ensureBlobs();
    const m = blobMeta(name);
    if (m === undefined) return undefined;
    const out = new Uint8Array(m.size);
    let at = 0;
    for (const c of blobs.chunks(name)) {
      out.set(c, at);
      at += c.length;
    }
    return out;
  },

  /** Up to `len` bytes from `offset` (fewer at the end). Throws `not_found` if there is no such blob. */
  read(name: string, offset: number, len: number): Uint8Array {
    ensureBlobs();
    const { size } = blobMetaOrNotFound(name);
    const end = Math.min(size, offset + len);
    const out = new Uint8Array(Math.max(end - offset, 0));
    let at = offset;
    while (at < end) {
      const seq = Math.floor(at / blobs.CHUNK_BYTES);
      const c = blobChunk(name, seq);
      const from = at % blobs.CHUNK_BYTES;
      const to = Math.min(c.length, from + (end - at));
      out.set(c.subarray(from, to), at - offset);
      at += to - from;
    }
    return out;
  },

  /** The chunks in order, each read when reached. */
  *chunks(name: string): Generator<Uint8Array> {
    ensureBlobs();
    const n = blobMeta(name)?.chunks ?? 0;
    for (let seq = 0; seq < n; seq++) yield blobChunk(name, seq);
  },

  /**
   * Writes the blob as the body of the response being built, one chunk
   * at a time; return a Response without a body after it. Returns the
   * bytes written; throws `not_found` if there is no such blob.
   */
  writeResponseBody(name: string): number {
    ensureBlobs();
    const { size } = blobMetaOrNotFound(name);
    for (const c of blobs.chunks(name)) host(() => witResponse.writeBody(c));
    return size;
  },

  /** Deletes the blob; returns whether there was one. */
  delete(name: string): boolean {
    ensureBlobs();
    sql.run("DELETE FROM wasmkeep_sdk_blob_chunks WHERE name = ?1", name);
    return sql.run("DELETE FROM wasmkeep_sdk_blobs WHERE name = ?1", name).rowsWritten > 0;
  },

  /** The blobs whose name starts with `prefix`, by name, with their sizes. */
  list(prefix = ""): Array<{ name: string; size: number }> {
    ensureBlobs();
    return sql
      .exec("SELECT name, size FROM wasmkeep_sdk_blobs WHERE substr(name, 1, length(?1)) = ?1 ORDER BY name", prefix)
      .raw()
      .map((r) => ({ name: r[0] as string, size: Number(r[1]) }));
  },
};

function checkBlobName(name: string): void {
  const n = utf8Encode(name).length;
  if (n === 0 || n > blobs.NAME_BYTES_MAX) {
    throw new WasmkeepError("invalid_blob", `a blob name is 1 to ${blobs.NAME_BYTES_MAX} bytes (name_bytes_max): got ${n}`);
  }
}

// ---------------------------------------------------------------- bookmarks

/**
 * Points in the actor's own history, and going back to one, as the Rust
 * SDK's `bookmarks` (and Durable Objects' `getBookmarkForTime` /
 * `onNextSessionRestoreBookmark`). Bookmarks name states the bucket keeps:
 * a node without a bucket answers `no_bucket`. The restore runs once this
 * event has committed and the bucket holds it, as the actor's next event.
 */
export const bookmarks = {
  /** A bookmark for the state as of now (to the millisecond). */
  current(): string {
    return host(() => witBookmarks.current());
  },
  /** A bookmark for the state at `atMs` (unix ms, not in the future). */
  forTime(atMs: number): string {
    return host(() => witBookmarks.forTime(atMs));
  },
  /** Goes back to `bookmark` once this event commits; returns the bookmark that undoes it. */
  restoreOnNextStart(bookmark: string): string {
    return host(() => witBookmarks.restoreOnNextStart(bookmark));
  },
};

// ---------------------------------------------------------------- cron

/** A recurring schedule. */
export interface Schedule {
  name: string;
  /** The cron expression. */
  expression: string;
  /** The IANA time zone it is read in. */
  zone: string;
  payload: Uint8Array;
  /** Its next run, unix milliseconds. */
  nextMs: number;
}

/** One run of a schedule, from {@link cron.takeDue}. */
export interface CronRun {
  name: string;
  /** When this run was due (the earliest, if runs were missed). */
  scheduledMs: number;
  /** How many later times of the schedule passed before this run (0 when on time). */
  missed: number;
  payload: Uint8Array;
}

/** A committed run, from {@link cron.history}. */
export interface PastRun {
  scheduledMs: number;
  ranMs: number;
  missed: number;
}

function schedule(r: SqlValue[]): Schedule {
  return { name: r[0] as string, expression: r[1] as string, zone: r[2] as string, payload: r[3] as Uint8Array, nextMs: Number(r[4]) };
}

function cronNext(expression: string, zone: string, afterMs: number): number {
  return host(() => witCron.nextAfter(expression, zone, afterMs));
}

const CRON_COLUMNS = "name, expression, zone, payload, next_ms";

/**
 * Recurring schedules from cron expressions in a time zone, on the alarm
 * beside the {@link timers}: the same tables and rules as the Rust SDK's
 * `cron` (the node evaluates the expressions and the zone rules for both).
 * Five fields (`minute hour day-of-month month day-of-week`) or six with
 * seconds first, `@hourly`, `@daily`, ... A local time a daylight-saving
 * change skips runs right after the gap; one that occurs twice runs once
 * (a wildcard hour runs in both passes). Runs missed while the actor could
 * not run come out of {@link cron.takeDue} as one run per schedule, with
 * the earliest `scheduledMs` and the count of later times in `missed`.
 */
export const cron = {
  /** Most schedules one actor keeps. */
  SCHEDULES_MAX: 1_000,
  /** Runs kept per schedule in its history. */
  HISTORY_MAX: 20,
  /** Missed times counted at most per run. */
  MISSED_COUNT_MAX: 1_000,

  /** Schedules (or replaces) `name`; returns its first run. Errors: `invalid_cron`, `invalid_timer`, `too_many_schedules`. */
  schedule(name: string, expression: string, zone: string = "UTC", payload: Bytes = new Uint8Array(0)): number {
    const p = bytes(payload);
    checkTimer(name, p);
    const next = cronNext(expression, zone, nowMs());
    ensureTimers();
    const exists = sql.exec("SELECT 1 FROM wasmkeep_sdk_cron WHERE name = ?1", name).raw().length > 0;
    if (!exists && (sql.one<{ n: number }>("SELECT count(*) AS n FROM wasmkeep_sdk_cron").n as number) >= cron.SCHEDULES_MAX) {
      throw new WasmkeepError("too_many_schedules", `the actor already has schedules_max=${cron.SCHEDULES_MAX} schedules: cancel one first`);
    }
    sql.run("INSERT OR REPLACE INTO wasmkeep_sdk_cron (name, expression, zone, payload, next_ms) VALUES (?1, ?2, ?3, ?4, ?5)", name, expression, zone, p, next);
    rearmUnlessInAlarm();
    return next;
  },

  /** Cancels `name` and forgets its history; returns whether there was one. */
  cancel(name: string): boolean {
    ensureTimers();
    const n = sql.run("DELETE FROM wasmkeep_sdk_cron WHERE name = ?1", name).rowsWritten;
    sql.run("DELETE FROM wasmkeep_sdk_cron_runs WHERE name = ?1", name);
    rearmUnlessInAlarm();
    return n > 0;
  },

  /** The schedule `name`, if any. */
  get(name: string): Schedule | undefined {
    ensureTimers();
    const r = sql.exec(`SELECT ${CRON_COLUMNS} FROM wasmkeep_sdk_cron WHERE name = ?1`, name).raw()[0];
    return r === undefined ? undefined : schedule(r);
  },

  /** Every schedule, next run first (ties by name). */
  list(): Schedule[] {
    ensureTimers();
    return sql.exec(`SELECT ${CRON_COLUMNS} FROM wasmkeep_sdk_cron ORDER BY next_ms, name`).raw().map(schedule);
  },

  /** The last committed runs of `name`, newest first. */
  history(name: string): PastRun[] {
    ensureTimers();
    return sql
      .exec("SELECT scheduled_ms, ran_ms, missed FROM wasmkeep_sdk_cron_runs WHERE name = ?1 ORDER BY scheduled_ms DESC", name)
      .raw()
      .map((r) => ({ scheduledMs: Number(r[0]), ranMs: Number(r[1]), missed: Number(r[2]) }));
  },

  /** The runs due at `now` (earliest first); each schedule moves past `now`. Call it from the alarm handler. */
  takeDue(now: number = nowMs()): CronRun[] {
    ensureTimers();
    const due = sql
      .exec(`SELECT ${CRON_COLUMNS} FROM wasmkeep_sdk_cron WHERE next_ms <= ?1 ORDER BY next_ms, name LIMIT ?2`, now, timers.DUE_PER_RUN_MAX)
      .raw()
      .map(schedule);
    const runs: CronRun[] = [];
    for (const s of due) {
      let missed = 0;
      let t = cronNext(s.expression, s.zone, s.nextMs);
      while (t <= now) {
        if (missed === cron.MISSED_COUNT_MAX) {
          t = cronNext(s.expression, s.zone, now);
          break;
        }
        missed += 1;
        t = cronNext(s.expression, s.zone, t);
      }
      sql.run("UPDATE wasmkeep_sdk_cron SET next_ms = ?2 WHERE name = ?1", s.name, t);
      sql.run("INSERT OR REPLACE INTO wasmkeep_sdk_cron_runs (name, scheduled_ms, ran_ms, missed) VALUES (?1, ?2, ?3, ?4)", s.name, s.nextMs, now, missed);
      sql.run(
        "DELETE FROM wasmkeep_sdk_cron_runs WHERE name = ?1 AND scheduled_ms NOT IN (SELECT scheduled_ms FROM wasmkeep_sdk_cron_runs WHERE name = ?1 ORDER BY scheduled_ms DESC LIMIT ?2)",
        s.name,
        cron.HISTORY_MAX,
      );
      runs.push({ name: s.name, scheduledMs: s.nextMs, missed, payload: s.payload });
    }
    rearmUnlessInAlarm();
    return runs;
  },
};

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
    return host(() => witOutbox.fetch(witCall(call), c));
  },
};

/**
 * Waiting for an answer inside a handler, without interleaving (ADR
 * 0056), in `request` and `alarm`: `const total = calls.wait<TallyApi>("tally_api", to).add({ by: 5 })`
 * or `awaits.message(to, body)`. Nothing else of this actor runs until the
 * answer is in, so what the handler read before the wait still holds
 * after it.
 *
 * The first time, the answer is not there: the wait throws a
 * {@link WasmkeepError} with code `suspended`; let it leave the handler
 * (whatever the handler does instead, the node rolls back everything the
 * run did). The node sends the call, keeps the event and runs it again
 * from its start when the answer comes: each wait it passed returns its
 * answer at once, `now()` reads the first run's time and `uniqueId()`
 * repeats. So the code before a wait must do the same on every run:
 * decide from storage, the request, `now()` and `uniqueId()`, never from
 * `Math.random()` or `Date.now()` (a wait that asks for another call than
 * the first run did fails the event with `await_nondeterministic`).
 *
 * Each wait ends by its deadline (`withinMs`: 30 s by default, at most
 * 300 s) with the error `await_timeout`; waiting for itself, or a call
 * that closes a cycle of waits between actors, fails at once with
 * `await_deadlock`; 64 waits per event. A wait holds the whole actor for
 * the call's round trip: for long calls or fan-out, use {@link outbox}.
 */
export const awaits = {
  /** The answer of `target`'s `message` to `body` (its bytes), or its error. */
  message(target: Address, body: Bytes, withinMs = 0): Uint8Array {
    const a = answer(host(() => witAwaits.wait({ tag: "message", val: [target, bytes(body)] }, withinMs)));
    if (a.kind === "reply") return a.body;
    if (a.kind === "refused" || a.kind === "failed") throw a.error;
    throw new WasmkeepError("internal", "a message was answered as an HTTP call");
  },
  /** The answer to an HTTP call (any status), or why it could not be made. */
  fetch(call: HttpCall, withinMs = 0): { status: number; headers: Array<[string, string]>; body: Uint8Array } {
    const a = answer(host(() => witAwaits.wait({ tag: "fetch", val: witCall(call) }, withinMs)));
    if (a.kind === "http") return { status: a.status, headers: a.headers, body: a.body };
    if (a.kind === "refused" || a.kind === "failed") throw a.error;
    throw new WasmkeepError("internal", "an HTTP call was answered as a message");
  },
};

/** An HTTP call as the node's interfaces take it. */
function witCall(call: HttpCall): witOutbox.HttpCall {
  return {
    method: call.method ?? "GET",
    url: call.url,
    headers: call.headers ?? [],
    body: bytes(call.body),
    timeoutMs: call.timeoutMs ?? null,
  };
}

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

// ---------------------------------------------------------------- calls

/**
 * The methods of a callable interface: each takes one object of named
 * arguments and returns a JSON value.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Methods<T> = { [K in keyof T]: (args: any) => unknown };

/** A caller's stub of interface `T`: each method sends its call and returns the send's sequence number. */
export type Client<T extends Methods<T>, C = unknown> = {
  [K in keyof T]: (args: Parameters<T[K]>[0], context?: C) => number;
};

/** A stub of interface `T` whose methods wait for their typed answer ({@link awaits}). */
export type Waiting<T extends Methods<T>> = {
  [K in keyof T]: (args: Parameters<T[K]>[0]) => ReturnType<T[K]>;
};

/** A typed answer to a call of interface `T`. */
export type Reply<T extends Methods<T>, C = unknown> = {
  [K in keyof T]:
    | { method: K; ok: true; value: ReturnType<T[K]>; context: C }
    | { method: K; ok: false; error: WasmkeepError; context: C };
}[keyof T];

const CALL_TAG = "wk-call:";

/** The {@link Actor} hooks, never callable by name. */
const ACTOR_HOOKS = new Set(["init", "request", "alarm", "message", "response", "socketMessage", "socketClose", "socketError"]);

function decodeCall(iface: string, msg: Message): { method: string; args: unknown } | undefined {
  let v: { call?: unknown; args?: unknown };
  try {
    v = JSON.parse(msg.text()) as { call?: unknown; args?: unknown };
  } catch {
    return undefined;
  }
  if (v === null || typeof v !== "object" || typeof v.call !== "string") return undefined;
  const dot = v.call.indexOf(".");
  if (dot < 0 || v.call.slice(0, dot) !== iface) return undefined;
  return { method: v.call.slice(dot + 1), args: v.args ?? {} };
}

/**
 * Typed calls between actors on the outbox (ADR 0051), with the wire
 * format of the Rust SDK's `interface!`, so either language calls the
 * other: the body is `{"call":"<interface>.<method>","args":{...}}`, the
 * answer the result as JSON. Declare the interface once as a TypeScript
 * interface whose methods take one object of named arguments; the callee
 * serves it from `message`, callers use {@link calls.client} and read the
 * answer with {@link calls.reply} in `response`. No turn waits.
 *
 * Versioning: arguments travel by name; add new ones as optional (an
 * older caller omits them). TypeScript types are not checked at run time:
 * `serve` refuses a body whose `args` is not an object (`bad_arguments`)
 * and a method the implementation lacks (`unknown_method`); check values
 * a caller of another build may send.
 */
export const calls = {
  /** Whether `msg` is a call of interface `iface` (to route among several). */
  isCallOf(iface: string, msg: Message): boolean {
    return decodeCall(iface, msg) !== undefined;
  },

  /** Runs the call `msg` carries on `impl` and encodes its answer (for `message`). */
  serve<T extends Methods<T>>(iface: string, msg: Message, impl: T): Uint8Array {
    const call = decodeCall(iface, msg);
    if (call === undefined) {
      throw new WasmkeepError("unknown_method", `\`${iface}\` has no method \`(not a call of this interface)\` here`);
    }
    const f = (impl as Record<string, unknown>)[call.method];
    // Never what every object has, nor an actor's own hooks when the
    // actor passes itself as the implementation.
    if (typeof f !== "function" || call.method in Object.prototype || ACTOR_HOOKS.has(call.method)) {
      throw new WasmkeepError("unknown_method", `\`${iface}\` has no method \`${call.method}\` here (the callee may be older than the caller)`);
    }
    if (call.args === null || typeof call.args !== "object" || Array.isArray(call.args)) {
      throw new WasmkeepError("bad_arguments", `the arguments of \`${call.method}\` are not an object`);
    }
    const out = (f as (a: unknown) => unknown).call(impl, call.args);
    if (out instanceof Promise) throw new WasmkeepError("async_handler", "a callable method returned a Promise: storage is synchronous, see the outbox for what waits");
    return utf8Encode(JSON.stringify(out ?? null));
  },

  /** A stub for calling interface `iface` on actor `target`. */
  client<T extends Methods<T>, C = unknown>(iface: string, target: Address): Client<T, C> {
    return new Proxy({} as Client<T, C>, {
      get(_t, method) {
        if (typeof method !== "string") return undefined;
        return (args: unknown, context?: C): number => {
          const body = utf8Encode(JSON.stringify({ call: `${iface}.${method}`, args: args ?? {} }));
          const c = utf8Encode(`${CALL_TAG}${iface}.${method}\n${context === undefined ? "" : JSON.stringify(context)}`);
          return host(() => witOutbox.send(target, body, c));
        };
      },
    });
  },

  /**
   * A stub for calling interface `iface` on actor `target` inside a
   * handler, each method waiting for its typed answer (see
   * {@link awaits}; `request` and `alarm` only), at most `withinMs`.
   */
  wait<T extends Methods<T>>(iface: string, target: Address, withinMs = 0): Waiting<T> {
    return new Proxy({} as Waiting<T>, {
      get(_t, method) {
        if (typeof method !== "string") return undefined;
        return (args: unknown): unknown => {
          const body = utf8Encode(JSON.stringify({ call: `${iface}.${method}`, args: args ?? {} }));
          const answer = awaits.message(target, body, withinMs);
          try {
            return JSON.parse(utf8Decode(answer));
          } catch (e) {
            throw new WasmkeepError("bad_answer", `the answer is not JSON: ${(e as Error).message}`);
          }
        };
      },
    });
  },

  /** The typed answer and the caller's context, if `r` answers a call of `iface`. */
  reply<T extends Methods<T>, C = unknown>(iface: string, r: OutboxResponse): Reply<T, C> | undefined {
    if (!(r.context instanceof Uint8Array)) return undefined;
    const text = utf8Decode(r.context);
    if (!text.startsWith(CALL_TAG)) return undefined;
    const nl = text.indexOf("\n");
    if (nl < 0) return undefined;
    const call = text.slice(CALL_TAG.length, nl);
    const dot = call.indexOf(".");
    if (dot < 0 || call.slice(0, dot) !== iface) return undefined;
    const method = call.slice(dot + 1) as keyof T;
    const rest = text.slice(nl + 1);
    const context = (rest === "" ? undefined : JSON.parse(rest)) as C;
    const a = r.answer;
    if (a.kind === "reply") {
      let value: unknown;
      try {
        value = JSON.parse(utf8Decode(a.body));
      } catch (e) {
        const error = new WasmkeepError("bad_answer", `the answer is not JSON: ${(e as Error).message}`);
        return { method, ok: false, error, context } as Reply<T, C>;
      }
      return { method, ok: true, value, context } as Reply<T, C>;
    }
    if (a.kind === "refused" || a.kind === "failed") return { method, ok: false, error: a.error, context } as Reply<T, C>;
    return undefined;
  },
};

// ---------------------------------------------------------------- workflows

/** What a step's function sees. */
export interface StepContext {
  /** The instance's id. */
  id: string;
  /** This attempt at the step (1 for the first). */
  attempt: number;
  /** The input `start` was given. */
  input: unknown;
  /** The recorded result of the earlier step `name` (throws `no_such_step` if none). */
  result(name: string): unknown;
}

/** One step: a function, a sleep, or a wait for an event. */
export type WorkflowStep =
  | { name: string; kind: "run"; run: (ctx: StepContext) => unknown }
  | { name: string; kind: "sleep"; ms: number }
  | { name: string; kind: "wait"; event: string; timeoutMs: number }
  | { name: string; kind: "call"; make: (ctx: StepContext) => Outgoing; timeoutMs: number };

/** What a `call` step sends: a typed call (`"<interface>.<method>"`, named arguments) to another actor. */
export interface Outgoing {
  to: Address;
  call: string;
  args: unknown;
}

/** How a failing `run` step is retried. */
export interface RetryPolicy {
  attemptsMax: number;
  firstBackoffMs: number;
  backoffMaxMs: number;
}

/** A workflow: a name unique in the app, its steps in order, its retry policy. */
export interface WorkflowDef {
  name: string;
  steps: WorkflowStep[];
  retry?: RetryPolicy;
}

/** An instance, from {@link workflow.get}. */
export interface WorkflowInstance {
  id: string;
  workflow: string;
  /** `running`, `sleeping`, `waiting`, `retrying`, `paused`, `done`, `failed` or `cancelled`. */
  state: string;
  step: number;
  failures: number;
  wakeMs: number | null;
  error: string | null;
}

/** A recorded step, from {@link workflow.history}. */
export interface WorkflowDone {
  step: number;
  name: string;
  result: unknown;
  attempts: number;
  doneMs: number;
}

const DEFAULT_RETRY: RetryPolicy = { attemptsMax: 5, firstBackoffMs: 1_000, backoffMaxMs: 60_000 };
const WF_TAG = "wk-wf:";
const WF_CALL_TAG = "wk-wfcall:";

function wfContext(id: string, attempt: number, input: unknown): StepContext {
  return {
    id,
    attempt,
    input,
    result(name: string): unknown {
      const r = sql.exec("SELECT result FROM wasmkeep_sdk_workflow_steps WHERE id = ?1 AND name = ?2", id, name).raw()[0];
      if (r === undefined) throw new WasmkeepError("no_such_step", `step \`${name}\` has no result yet`);
      return parseJson(r[0] as string);
    },
  };
}

function wfSendCall(row: WfRow, step: number, make: (ctx: StepContext) => Outgoing, timeoutMs: number): void {
  const id = row.inst.id;
  const attempt = row.inst.failures + 1;
  let out: Outgoing;
  try {
    out = make(wfContext(id, attempt, row.input));
  } catch (e) {
    const err = e instanceof WasmkeepError ? `${e.code}: ${e.message}` : String(e);
    sql.run("UPDATE wasmkeep_sdk_workflows SET error = ?2 WHERE id = ?1", id, err);
    wfSetState(id, "failed", null);
    return;
  }
  const tag = JSON.stringify({ wf: id, step, gen: row.gen, attempt });
  const body = utf8Encode(JSON.stringify({ call: out.call, args: out.args ?? {} }));
  host(() => witOutbox.send(out.to, body, utf8Encode(WF_CALL_TAG + tag)));
  wfSetState(id, "calling", nowMs() + timeoutMs);
}

function wfFailAttempt(w: WorkflowDef, row: WfRow, error: string): void {
  const retry = w.retry ?? DEFAULT_RETRY;
  const failures = row.inst.failures + 1;
  sql.run("UPDATE wasmkeep_sdk_workflows SET failures = ?2, error = ?3 WHERE id = ?1", row.inst.id, failures, error);
  if (failures >= retry.attemptsMax) {
    wfSetState(row.inst.id, "failed", null);
  } else {
    const backoff = Math.min(retry.firstBackoffMs * 2 ** Math.min(failures - 1, 32), retry.backoffMaxMs);
    wfSetState(row.inst.id, "retrying", nowMs() + backoff);
  }
}

interface WfRow {
  inst: WorkflowInstance;
  gen: number;
  input: unknown;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

function wfLoad(id: string): WfRow | undefined {
  ensureTimers();
  const r = sql.exec("SELECT id, workflow, state, step, failures, wake_ms, error, gen, input FROM wasmkeep_sdk_workflows WHERE id = ?1", id).raw()[0];
  if (r === undefined) return undefined;
  return {
    inst: {
      id: r[0] as string,
      workflow: r[1] as string,
      state: r[2] as string,
      step: Number(r[3]),
      failures: Number(r[4]),
      wakeMs: r[5] === null ? null : Number(r[5]),
      error: r[6] === null ? null : (r[6] as string),
    },
    gen: Number(r[7]),
    input: parseJson(r[8] as string),
  };
}

function wfNeed(id: string): WfRow {
  const row = wfLoad(id);
  if (row === undefined) throw WasmkeepError.notFound(`no workflow instance \`${id}\``);
  return row;
}

function wfFind(all: WorkflowDef[], name: string): WorkflowDef {
  const w = all.find((x) => x.name === name);
  if (w === undefined) throw new WasmkeepError("unknown_workflow", `no workflow named \`${name}\` in this build`);
  return w;
}

function wfSetState(id: string, state: string, wakeMs: number | null): void {
  sql.run("UPDATE wasmkeep_sdk_workflows SET state = ?2, wake_ms = ?3, updated_ms = ?4 WHERE id = ?1", id, state, wakeMs, nowMs());
  rearmUnlessInAlarm();
}

function wfSendStep(id: string, step: number, gen: number): void {
  const me = witIdentity.id();
  const body = JSON.stringify({ wf: id, step, gen });
  host(() => witOutbox.send({ app: me.app, class: me.class, name: me.name }, utf8Encode(body), utf8Encode(WF_TAG + body)));
}

function wfComplete(w: WorkflowDef, row: WfRow, step: number, result: unknown, attempts: number): void {
  sql.run(
    "INSERT OR REPLACE INTO wasmkeep_sdk_workflow_steps (id, step, name, result, attempts, done_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    row.inst.id,
    step,
    w.steps[step].name,
    JSON.stringify(result ?? null),
    attempts,
    nowMs(),
  );
  sql.run("UPDATE wasmkeep_sdk_workflows SET step = ?2, failures = 0, error = NULL WHERE id = ?1", row.inst.id, step + 1);
  wfEnter(w, row, step + 1);
}

function wfEnter(w: WorkflowDef, row: WfRow, step: number): void {
  const id = row.inst.id;
  const s = w.steps[step];
  if (s === undefined) {
    wfSetState(id, "done", null);
    return;
  }
  if (s.kind === "run") {
    wfSetState(id, "running", null);
    wfSendStep(id, step, row.gen);
  } else if (s.kind === "sleep") {
    wfSetState(id, "sleeping", nowMs() + s.ms);
  } else if (s.kind === "call") {
    wfSendCall(row, step, s.make, s.timeoutMs);
  } else {
    const early = sql.exec("DELETE FROM wasmkeep_sdk_workflow_events WHERE id = ?1 AND event = ?2 RETURNING payload", id, s.event).raw()[0];
    if (early !== undefined) wfComplete(w, row, step, parseJson(early[0] as string), 1);
    else wfSetState(id, "waiting", nowMs() + s.timeoutMs);
  }
}

function wfStepOf(text: string): { id: string; step: number; gen: number } | undefined {
  const v = parseJson(text) as { wf?: unknown; step?: unknown; gen?: unknown } | null;
  if (v === null || typeof v !== "object" || typeof v.wf !== "string" || typeof v.step !== "number" || typeof v.gen !== "number") return undefined;
  return { id: v.wf, step: v.step, gen: v.gen };
}

function finished(state: string): boolean {
  return state === "done" || state === "failed" || state === "cancelled";
}

function wfCallAnswered(all: WorkflowDef[], tagText: string, r: OutboxResponse): void {
  const tag = parseJson(tagText) as { wf?: string; step?: number; gen?: number; attempt?: number } | null;
  if (tag === null || typeof tag.wf !== "string") return;
  const row = wfLoad(tag.wf);
  if (row === undefined) return;
  const current = row.inst.state === "calling" && row.inst.step === tag.step && row.gen === tag.gen && tag.attempt === row.inst.failures + 1;
  if (!current) return;
  const w = wfFind(all, row.inst.workflow);
  const a = r.answer;
  if (a.kind === "reply") wfComplete(w, row, row.inst.step, parseJson(utf8Decode(a.body)), row.inst.failures + 1);
  else if (a.kind === "refused" || a.kind === "failed") wfFailAttempt(w, row, `${a.error.code}: ${a.error.message}`);
}

/**
 * Durable workflows on the actor's own database, timers and outbox, with
 * the tables, rules and messages of the Rust SDK's `workflow`: each `run`
 * step runs in an event of its own (a message the actor sends itself),
 * its result recorded with its effects, so a step that committed never
 * runs again; a failing step is retried with backoff, then the instance
 * fails; `sleep` and `wait` (an event sent with {@link workflow.signal},
 * or a timeout) ride on the alarm shared with timers and cron. The actor
 * passes its workflows to {@link workflow.onMessage},
 * {@link workflow.onResponse} and {@link workflow.onAlarm}.
 */
export const workflow = {
  /** Most instances one actor keeps (finished ones until `forget`). */
  INSTANCES_MAX: 10_000,
  /** Longest instance id, in UTF-8 bytes. */
  ID_BYTES_MAX: 256,
  DEFAULT_RETRY,

  /** A step that runs `f` in an event of its own; what it returns (JSON) is recorded. */
  run(name: string, f: (ctx: StepContext) => unknown): WorkflowStep {
    return { name, kind: "run", run: f };
  },
  /** A step that waits `ms` milliseconds. */
  sleep(name: string, ms: number): WorkflowStep {
    return { name, kind: "sleep", ms };
  },
  /** A step that calls another actor and awaits its answer durably: its result is the answer; a refusal, failure or no answer within `timeoutMs` is a failed attempt, retried. */
  call(name: string, make: (ctx: StepContext) => Outgoing, timeoutMs: number): WorkflowStep {
    return { name, kind: "call", make, timeoutMs };
  },
  /** A step that waits for `event` at most `timeoutMs`; its result is the payload, or null after the timeout. */
  wait(name: string, event: string, timeoutMs: number): WorkflowStep {
    return { name, kind: "wait", event, timeoutMs };
  },

  /** Starts instance `id` of `w`; `conflict` if it exists. */
  start(w: WorkflowDef, id: string, input: unknown = null): void {
    const n = utf8Encode(id).length;
    if (n === 0 || n > workflow.ID_BYTES_MAX) throw WasmkeepError.badRequest(`a workflow id is 1 to ${workflow.ID_BYTES_MAX} bytes: got ${n}`);
    if (wfLoad(id) !== undefined) throw new WasmkeepError("conflict", `workflow instance \`${id}\` exists`);
    const count = sql.one<{ n: number }>("SELECT count(*) AS n FROM wasmkeep_sdk_workflows").n as number;
    if (count >= workflow.INSTANCES_MAX) {
      throw new WasmkeepError("too_many_workflows", `the actor keeps workflows_max=${workflow.INSTANCES_MAX} instances: forget finished ones`);
    }
    const now = nowMs();
    sql.run(
      "INSERT INTO wasmkeep_sdk_workflows (id, workflow, state, step, failures, wake_ms, error, gen, input, created_ms, updated_ms) VALUES (?1, ?2, 'running', 0, 0, NULL, NULL, 1, ?3, ?4, ?4)",
      id,
      w.name,
      JSON.stringify(input ?? null),
      now,
    );
    wfEnter(w, wfNeed(id), 0);
  },

  /** Sends `event` to instance `id`: a wait for it completes now, else it is kept for a later wait. */
  signal(all: WorkflowDef[], id: string, event: string, payload: unknown = null): void {
    const row = wfNeed(id);
    sql.run("INSERT OR REPLACE INTO wasmkeep_sdk_workflow_events (id, event, payload) VALUES (?1, ?2, ?3)", id, event, JSON.stringify(payload ?? null));
    const w = wfFind(all, row.inst.workflow);
    const s = w.steps[row.inst.step];
    if (row.inst.state === "waiting" && s !== undefined && s.kind === "wait" && s.event === event) wfEnter(w, row, row.inst.step);
  },

  /** Pauses instance `id` until `resume`. */
  pause(id: string): void {
    const row = wfNeed(id);
    if (finished(row.inst.state)) throw new WasmkeepError("conflict", `\`${id}\` is ${row.inst.state}`);
    wfSetState(id, "paused", null);
  },

  /** Resumes a paused or failed instance at the step it stopped at. */
  resume(all: WorkflowDef[], id: string): void {
    const row = wfNeed(id);
    if (row.inst.state !== "paused" && row.inst.state !== "failed") throw new WasmkeepError("conflict", `\`${id}\` is ${row.inst.state}`);
    sql.run("UPDATE wasmkeep_sdk_workflows SET failures = 0, gen = gen + 1 WHERE id = ?1", id);
    wfEnter(wfFind(all, row.inst.workflow), wfNeed(id), row.inst.step);
  },

  /** Cancels instance `id` for good. */
  cancel(id: string): void {
    wfNeed(id);
    sql.run("UPDATE wasmkeep_sdk_workflows SET gen = gen + 1 WHERE id = ?1", id);
    wfSetState(id, "cancelled", null);
  },

  /** Runs instance `id` again from step `stepName` (that step's record and later ones are dropped). */
  restartFrom(all: WorkflowDef[], id: string, stepName: string): void {
    const row = wfNeed(id);
    const w = wfFind(all, row.inst.workflow);
    const step = w.steps.findIndex((s) => s.name === stepName);
    if (step < 0) throw WasmkeepError.badRequest(`\`${w.name}\` has no step \`${stepName}\``);
    sql.run("DELETE FROM wasmkeep_sdk_workflow_steps WHERE id = ?1 AND step >= ?2", id, step);
    sql.run("UPDATE wasmkeep_sdk_workflows SET step = ?2, failures = 0, error = NULL, gen = gen + 1 WHERE id = ?1", id, step);
    wfEnter(w, wfNeed(id), step);
  },

  /** Instance `id`, if any. */
  get(id: string): WorkflowInstance | undefined {
    return wfLoad(id)?.inst;
  },

  /** The recorded steps of `id`, in order. */
  history(id: string): WorkflowDone[] {
    ensureTimers();
    return sql
      .exec("SELECT step, name, result, attempts, done_ms FROM wasmkeep_sdk_workflow_steps WHERE id = ?1 ORDER BY step", id)
      .raw()
      .map((r) => ({ step: Number(r[0]), name: r[1] as string, result: parseJson(r[2] as string), attempts: Number(r[3]), doneMs: Number(r[4]) }));
  },

  /** Forgets a finished instance and its records. */
  forget(id: string): boolean {
    const row = wfLoad(id);
    if (row === undefined) return false;
    if (!finished(row.inst.state)) throw new WasmkeepError("conflict", `\`${id}\` is ${row.inst.state}`);
    for (const t of ["wasmkeep_sdk_workflow_steps", "wasmkeep_sdk_workflow_events", "wasmkeep_sdk_workflows"]) sql.run(`DELETE FROM ${t} WHERE id = ?1`, id);
    return true;
  },

  /** Runs the step a workflow message names (for `message`); `undefined` if `msg` is not one. */
  onMessage(all: WorkflowDef[], msg: Message): Uint8Array | undefined {
    const me = id();
    if (msg.from.app !== me.app || msg.from.class !== me.class || msg.from.name !== me.name) return undefined;
    const s = wfStepOf(msg.text());
    if (s === undefined) return undefined;
    const row = wfLoad(s.id);
    if (row === undefined || row.inst.state !== "running" || row.inst.step !== s.step || row.gen !== s.gen) return utf8Encode("stale");
    const w = wfFind(all, row.inst.workflow);
    const step = w.steps[s.step];
    if (step === undefined || step.kind !== "run") return utf8Encode("stale");
    const attempt = row.inst.failures + 1;
    const result = step.run(wfContext(s.id, attempt, row.input));
    if (result instanceof Promise) throw new WasmkeepError("async_handler", "a workflow step returned a Promise: storage is synchronous");
    wfComplete(w, row, s.step, result, attempt);
    return utf8Encode("done");
  },

  /** Applies the answer to a step message (for `response`); false if `r` is not one. */
  onResponse(all: WorkflowDef[], r: OutboxResponse): boolean {
    if (!(r.context instanceof Uint8Array)) return false;
    const text = utf8Decode(r.context);
    if (text.startsWith(WF_CALL_TAG)) {
      wfCallAnswered(all, text.slice(WF_CALL_TAG.length), r);
      return true;
    }
    if (!text.startsWith(WF_TAG)) return false;
    const s = wfStepOf(text.slice(WF_TAG.length));
    if (s === undefined) return false;
    const a = r.answer;
    if (a.kind !== "refused" && a.kind !== "failed") return true;
    const row = wfLoad(s.id);
    if (row === undefined || row.inst.state !== "running" || row.inst.step !== s.step || row.gen !== s.gen) return true;
    wfFailAttempt(wfFind(all, row.inst.workflow), row, `${a.error.code}: ${a.error.message}`);
    return true;
  },

  /** Wakes the instances due at `now` (for `alarm`): a sleep ends, a wait times out, a failed step runs again. */
  onAlarm(all: WorkflowDef[], now: number = nowMs()): void {
    ensureTimers();
    const due = sql
      .exec(
        "SELECT id FROM wasmkeep_sdk_workflows WHERE wake_ms <= ?1 AND state IN ('sleeping', 'waiting', 'retrying', 'calling') ORDER BY wake_ms, id LIMIT ?2",
        now,
        timers.DUE_PER_RUN_MAX,
      )
      .raw()
      .map((r) => r[0] as string);
    for (const id of due) {
      const row = wfNeed(id);
      const w = wfFind(all, row.inst.workflow);
      if (row.inst.state === "sleeping" || row.inst.state === "waiting") {
        wfComplete(w, row, row.inst.step, null, 1);
      } else if (row.inst.state === "calling") {
        wfFailAttempt(w, row, "timeout: no answer to the call in time");
      } else {
        // Retrying: the step again (a run step's message, or a call step's call).
        wfEnter(w, row, row.inst.step);
      }
    }
  },
};

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
  /**
   * The close code of a connection that failed rather than closed (no
   * close frame, a protocol error, an upgrade that never completed);
   * such an end comes to {@link Actor.socketError}.
   */
  ABNORMAL_CLOSURE: 1006,
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
  /**
   * A socket closed, by its client, a limit or the node; `code` is the
   * WebSocket close code. A failed connection (1006) comes to
   * `socketError` instead when the class has it.
   */
  socketClose?(socket: SocketInfo, code: number, reason: string): void;
  /**
   * A socket failed rather than closed (Durable Objects' `webSocketError`):
   * the connection ended without a close frame, broke the protocol, or its
   * upgrade never completed (`sockets.ABNORMAL_CLOSURE`, 1006). Without
   * this hook such an end comes to `socketClose` with code 1006.
   */
  socketError?(socket: SocketInfo, reason: string): void;
}

/**
 * A class the app serves: made with `new`, and with an optional static
 * `migrations` list (see {@link schema}).
 */
export type ActorClass = (new () => Actor) & { readonly migrations?: readonly string[] };

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
  // Every export asks for its actor once per event: the class's
  // migrations the database lacks run first.
  const actor = (cls: string): Actor => {
    const C = classes[cls];
    if (C === undefined) throw new WasmkeepError("class_not_found", `this app has no class \`${cls}\``);
    const migrations = C.migrations;
    if (migrations !== undefined && migrations.length > 0) migrate(migrations);
    let a = objects.get(cls);
    if (a === undefined) {
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
      run(() => {
        const a = actor(cls);
        if (code === sockets.ABNORMAL_CLOSURE && a.socketError) sync(a.socketError(s, reason));
        else sync(a.socketClose?.(s, code, reason));
      }),
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
