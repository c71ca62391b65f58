// The wasmkeep test kit for TypeScript and JavaScript: drives a real node
// from `node --test` (or vitest), with no Rust in the test.
//
//   import { startNode } from "@wasmkeep/sdk/testing";
//   const node = await startNode();
//   await node.deploy("dev/app", ".wasmkeep/app.wasm");
//   const alice = node.actor("dev/app/counter/alice");
//   (await alice.post("/increment")).json();   // { value: 1 }
//   await node.advance(60_000);                 // alarms due on the way run, in order
//   await node.crash();                         // SIGKILL, then start again on the same data
//   await node.stop();
//
// The node is a real `wasmkeep serve` process in test mode
// (`--test-clock`: loopback only, its clock stands still until `advance`
// moves it) on a free port of 127.0.0.1, with a temporary data folder and
// its compile cache shared between the tests of one machine (so a
// component is compiled once). `startNode({ realClock: true })` runs it on
// the real clock instead. The
// binary is `WASMKEEP_BIN`, else the project's `config.wasmkeep` (npm sets
// `npm_package_config_wasmkeep`), else `wasmkeep` on the PATH.

import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

/** How long a node may take to say it listens (a first compile included). */
const START_MS_MAX = 180_000;

/** An answer: status, headers, body, with text and JSON helpers. */
export class TestResponse {
  constructor(status, headers, body) {
    this.status = status;
    this.headers = headers;
    this.body = body;
  }
  text() {
    return new TextDecoder().decode(this.body);
  }
  json() {
    return JSON.parse(this.text());
  }
}

function binary() {
  return process.env.WASMKEEP_BIN ?? process.env.npm_package_config_wasmkeep ?? "wasmkeep";
}

/**
 * Starts a node; resolves once it listens. `options.config`: node.toml
 * text; `options.startMs`: where the test clock starts (default: now);
 * `options.realClock`: the real clock, which `advance` cannot move.
 */
export async function startNode(options = {}) {
  const dir = await mkdtemp(join(tmpdir(), "wasmkeep-test-"));
  const node = new TestNode(dir, options);
  await node.start();
  return node;
}

export class TestNode {
  #dir;
  #options;
  #child = null;
  #deployed = [];
  /** The test clock's time, which only `advance` moves (undefined on the real clock). */
  #nowMs;
  /** `http://127.0.0.1:PORT` of the running node. */
  base = "";

  constructor(dir, options) {
    this.#dir = dir;
    this.#options = options;
    this.#nowMs = options.realClock ? undefined : (options.startMs ?? Date.now());
  }

  /** The node's clock, unix milliseconds. */
  now() {
    return this.#nowMs ?? Date.now();
  }

  /**
   * Moves the node's clock forward by `ms`, running every alarm that comes
   * due on the way, in due order, each at its own time. Resolves to how
   * many alarm handlers succeeded.
   */
  async advance(ms) {
    return this.advanceTo(this.now() + ms);
  }

  /** Like `advance`, to an absolute time. */
  async advanceTo(toMs) {
    if (this.#nowMs === undefined) throw new Error("this node runs on the real clock (startNode({ realClock: true }))");
    const r = await this.fetch("POST", `/admin/v1/test/clock?to_ms=${toMs}`);
    if (r.status !== 200) throw new Error(`advance the clock: ${r.status} ${r.text()}`);
    const v = r.json();
    this.#nowMs = v.now_ms;
    return v.alarms_ran;
  }

  /** The node's data folder. */
  get dataDir() {
    return join(this.#dir, "data");
  }

  async start() {
    const args = ["serve", "--data", this.dataDir, "--listen", "127.0.0.1:0"];
    // A restart keeps the time the test moved to.
    if (this.#nowMs !== undefined) args.push("--test-clock", String(this.#nowMs));
    if (this.#options.config !== undefined) {
      const path = join(this.#dir, "node.toml");
      await (await import("node:fs/promises")).writeFile(path, this.#options.config);
      args.push("--config", path);
    }
    const cache = join(tmpdir(), "wasmkeep-testkit-js-cache");
    const child = spawn(binary(), args, {
      stdio: ["ignore", "pipe", "inherit"],
      env: {
        ...process.env,
        WASMKEEP_COMPILE_CACHE: cache,
        WASMKEEP_COMPILE_CACHE_KEY: `${cache}.key`,
        WASMKEEP_LOG: process.env.WASMKEEP_LOG ?? "warn",
      },
    });
    this.#child = child;
    this.base = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the node did not listen within ${START_MS_MAX} ms`)), START_MS_MAX);
      child.once("error", (e) => reject(new Error(`could not start ${binary()}: ${e.message} (set WASMKEEP_BIN)`)));
      child.once("exit", (code) => reject(new Error(`the node exited (${code}) before it listened`)));
      createInterface({ input: child.stdout }).on("line", (line) => {
        const m = /listening on (\S+)/.exec(line);
        if (m) {
          clearTimeout(timer);
          resolve(m[1]);
        }
      });
    });
  }

  /** Deploys the component at `wasmPath` as `tenant/app`; resolves to the node's answer. */
  async deploy(tenantApp, wasmPath) {
    const body = await readFile(wasmPath);
    const r = await this.fetch("PUT", `/admin/v1/apps/${tenantApp}`, body);
    if (r.status !== 200) throw new Error(`deploy ${tenantApp}: ${r.status} ${r.text()}`);
    this.#deployed.push([tenantApp, wasmPath]);
    return r.json();
  }

  /** One actor, `tenant/app/class/name`. */
  actor(address) {
    const node = this;
    const path = (p) => `/v1/${address}${p.startsWith("/") ? p : `/${p}`}`;
    return {
      get: (p) => node.fetch("GET", path(p)),
      post: (p, body = "") => node.fetch("POST", path(p), body),
      put: (p, body = "") => node.fetch("PUT", path(p), body),
      delete: (p) => node.fetch("DELETE", path(p)),
      request: (method, p, body, headers) => node.fetch(method, path(p), body, headers),
      /** What the node knows of the actor (its alarm among it). */
      inspect: async () => (await node.fetch("GET", `/admin/v1/actors/${address}`)).json(),
      /** A read-only statement over the actor's database: `{columns, rows}`. */
      sql: async (statement) => (await node.fetch("POST", `/admin/v1/actors/${address}/sql`, statement)).json(),
    };
  }

  /** A request to the node. */
  async fetch(method, path, body, headers = {}) {
    const r = await fetch(`${this.base}${path}`, { method, body, headers });
    return new TestResponse(r.status, r.headers, new Uint8Array(await r.arrayBuffer()));
  }

  /** Kills the node (SIGKILL: no clean stop) and starts it again on the same data. */
  async crash() {
    await this.#end("SIGKILL");
    await this.start();
  }

  /** Stops the node cleanly (SIGTERM) and starts it again on the same data. */
  async restart() {
    await this.#end("SIGTERM");
    await this.start();
  }

  /** Stops the node and removes its data. */
  async stop() {
    await this.#end("SIGTERM");
    await rm(this.#dir, { recursive: true, force: true });
  }

  async #end(signal) {
    const child = this.#child;
    if (child === null || child.exitCode !== null) return;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill(signal);
    await exited;
    this.#child = null;
  }
}
