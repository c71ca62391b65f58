// The node's interfaces as componentize-qjs presents them to JavaScript
// (`wit/actor.wit`, package wasmkeep:actor@0.2.0). Written by hand from the
// WIT: `u64`/`s64` are numbers (exact up to 2^53), `list<u8>` is
// Uint8Array, `option<T>` is `T | null`, a `result`'s `err` is thrown as
// the error record itself (and an export throws one to return `err`). The
// SDK (`index.ts`) is the only module that imports these; `wasmkeep build`
// fails if one names a function the WIT does not have.

declare module "wasmkeep:actor/types@0.2.0" {
  export type Value =
    | { tag: "null" }
    | { tag: "integer"; val: number }
    | { tag: "real"; val: number }
    | { tag: "text"; val: string }
    | { tag: "blob"; val: Uint8Array };
  export interface Error {
    code: string;
    message: string;
  }
  export interface Request {
    method: string;
    path: string;
    query: string;
    headers: Array<[string, string]>;
    body: Uint8Array;
  }
  export interface AlarmInfo {
    retryCount: number;
    isRetry: boolean;
    scheduledMs: number;
  }
  export interface Address {
    app: string;
    class: string;
    name: string;
  }
}

declare module "wasmkeep:actor/sql@0.2.0" {
  import type { Value } from "wasmkeep:actor/types@0.2.0";
  export interface QueryResult {
    columns: string[];
    rows: Value[][];
    rowsRead: number;
    rowsWritten: number;
  }
  export interface ExecResult {
    rowsWritten: number;
    lastInsertRowid: number;
  }
  export function query(statement: string, params: Value[]): QueryResult;
  export function execute(statement: string, params: Value[]): ExecResult;
  export function databaseSize(): number | bigint;
}

declare module "wasmkeep:actor/kv@0.2.0" {
  export interface ListOptions {
    prefix: string | null;
    start: string | null;
    end: string | null;
    limit: number | null;
    reverse: boolean;
  }
  export function get(key: string): Uint8Array | null;
  export function put(key: string, value: Uint8Array): void;
  function _delete(key: string): boolean;
  export { _delete as delete };
  export function list(options: ListOptions): Array<[string, Uint8Array]>;
  export function deletePrefix(prefix: string): number | bigint;
}

declare module "wasmkeep:actor/alarm@0.2.0" {
  export function setAlarm(atMs: number): void;
  export function getAlarm(): number | null;
  export function deleteAlarm(): void;
}

declare module "wasmkeep:actor/identity@0.2.0" {
  export interface ActorId {
    tenant: string;
    app: string;
    class: string;
    name: string;
  }
  export function id(): ActorId;
  export function uniqueId(): string;
}

declare module "wasmkeep:actor/clock@0.2.0" {
  export function nowMs(): number;
}

declare module "wasmkeep:actor/bookmarks@0.2.0" {
  export function current(): string;
  export function forTime(atMs: number): string;
  export function restoreOnNextStart(bookmark: string): string;
}

declare module "wasmkeep:actor/cron@0.2.0" {
  export function nextAfter(expression: string, zone: string, afterMs: number): number;
}

declare module "wasmkeep:actor/log@0.2.0" {
  export type Level = "trace" | "debug" | "info" | "warn" | "error";
  export function log(level: Level, message: string): void;
}

declare module "wasmkeep:actor/response@0.2.0" {
  export function addHeader(name: string, value: string): void;
  export function writeBody(chunk: Uint8Array): void;
}

declare module "wasmkeep:actor/replies@0.2.0" {
  export function park(timeoutMs: number): number;
  export function complete(
    ticket: number,
    status: number,
    headers: Array<[string, string]>,
    body: Uint8Array,
  ): void;
}

declare module "wasmkeep:actor/sockets@0.2.0" {
  export type Message = { tag: "text"; val: string } | { tag: "binary"; val: Uint8Array };
  export interface SocketInfo {
    id: number;
    tags: string[];
    attachment: Uint8Array;
  }
  export function accept(tags: string[], attachment: Uint8Array): number;
  export function send(id: number, message: Message): void;
  export function broadcast(tag: string | null, message: Message): number;
  export function close(id: number, code: number, reason: string): void;
  export function list(tag: string | null): SocketInfo[];
  export function setAttachment(id: number, attachment: Uint8Array): void;
  export function setAutoResponse(pair: [string, string] | null): void;
}

declare module "wasmkeep:actor/config@0.2.0" {
  export function get(name: string): string | null;
}

declare module "wasmkeep:actor/awaits@0.2.0" {
  import type { Address } from "wasmkeep:actor/types@0.2.0";
  import type { HttpCall } from "wasmkeep:actor/outbox@0.2.0";
  export type Call =
    | { tag: "message"; val: [Address, Uint8Array] }
    | { tag: "fetch"; val: HttpCall };
  export function wait(call: Call, withinMs: number): unknown;
}

declare module "wasmkeep:actor/outbox@0.2.0" {
  import type { Address } from "wasmkeep:actor/types@0.2.0";
  export interface HttpCall {
    method: string;
    url: string;
    headers: Array<[string, string]>;
    body: Uint8Array;
    timeoutMs: number | null;
  }
  export function send(to: Address, body: Uint8Array, context: Uint8Array): number;
  export function fetch(call: HttpCall, context: Uint8Array): number;
}
