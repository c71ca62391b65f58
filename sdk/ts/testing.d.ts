/** An answer from the node. */
export declare class TestResponse {
  readonly status: number;
  readonly headers: { get(name: string): string | null };
  readonly body: Uint8Array;
  text(): string;
  json<T = any>(): T;
}

/** One actor of a test node. */
export interface TestActor {
  get(path: string): Promise<TestResponse>;
  post(path: string, body?: string | Uint8Array): Promise<TestResponse>;
  put(path: string, body?: string | Uint8Array): Promise<TestResponse>;
  delete(path: string): Promise<TestResponse>;
  request(method: string, path: string, body?: string | Uint8Array, headers?: Record<string, string>): Promise<TestResponse>;
  /** What the node knows of the actor (`GET /admin/v1/actors/...`). */
  inspect(): Promise<any>;
  /** A read-only statement over the actor's database. */
  sql(statement: string): Promise<{ columns: string[]; rows: unknown[][] }>;
}

/** A real node on a free loopback port with a temporary data folder. */
export declare class TestNode {
  readonly base: string;
  readonly dataDir: string;
  /** The node's clock, unix milliseconds. */
  now(): number;
  /** Moves the test clock forward by `ms`, running the alarms due on the way; resolves to how many handlers succeeded. */
  advance(ms: number): Promise<number>;
  /** Like `advance`, to an absolute time. */
  advanceTo(toMs: number): Promise<number>;
  deploy(tenantApp: string, wasmPath: string): Promise<any>;
  actor(address: string): TestActor;
  fetch(method: string, path: string, body?: string | Uint8Array, headers?: Record<string, string>): Promise<TestResponse>;
  /** SIGKILL, then start again on the same data. */
  crash(): Promise<void>;
  /** SIGTERM, then start again on the same data. */
  restart(): Promise<void>;
  /** Stops the node and removes its data. */
  stop(): Promise<void>;
}

/** Starts a node (test clock by default); `config` is node.toml text. */
export declare function startNode(options?: { config?: string; startMs?: number; realClock?: boolean }): Promise<TestNode>;
