#!/usr/bin/env node
// Builds a wasmkeep app written in TypeScript or JavaScript into a
// WebAssembly component:
//
//   node build.mjs ENTRY OUT.wasm
//
// ENTRY is the app's module (`src/index.ts`), whose default export is the
// SDK's `app({...})`. esbuild bundles it with its npm dependencies and this
// SDK (whatever version of `@wasmkeep/sdk` ENTRY imports, the one beside
// this script is bundled), then componentize-qjs puts the bundle, already
// evaluated, into QuickJS as a component of the world `actor` of
// `wit/actor.wit` (ADR 0048). Every WASI import is a stub that traps: the
// component needs only the node's interfaces. Prints one JSON line:
// {"out", "bytes", "bundle_ms", "componentize_ms"}. Exits 1 with the
// bundler's or componentizer's message.

import { build } from "esbuild";
import { componentize } from "componentize-qjs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const [entryArg, outArg] = process.argv.slice(2);
if (!entryArg || !outArg) {
  console.error("usage: node build.mjs ENTRY OUT.wasm");
  process.exit(2);
}
const entry = resolve(entryArg);
const out = resolve(outArg);
const wit = resolve(here, "..", "..", "wit", "actor.wit");

const started = Date.now();
const work = await mkdtemp(join(tmpdir(), "wasmkeep-build-"));
try {
  const bundle = join(work, "app.js");
  await build({
    stdin: {
      // The component's exports are the app's three objects.
      contents: [
        `import app from ${JSON.stringify(entry)};`,
        "export const handler = app.handler;",
        "export const inbox = app.inbox;",
        "export const socketHandler = app.socketHandler;",
      ].join("\n"),
      resolveDir: dirname(entry),
      loader: "js",
    },
    bundle: true,
    format: "esm",
    platform: "neutral",
    target: "es2022",
    mainFields: ["module", "main"],
    outfile: bundle,
    external: ["wasmkeep:*"],
    alias: { "@wasmkeep/sdk": join(here, "src", "index.ts") },
    logLevel: "error",
  });
  const bundled = Date.now();
  const { component } = await componentize({
    jsSource: await readFile(bundle, "utf8"),
    witPath: wit,
    world: "actor",
    // WASI is not granted: its imports trap if called (the SDK gives
    // `Date` the node's clock), so the component asks the node for
    // nothing but its own interfaces.
    stubWasi: true,
    // Exports are plain synchronous functions, as the node calls them.
    sync: true,
  });
  await writeFile(out, component);
  console.log(
    JSON.stringify({
      out,
      bytes: component.length,
      bundle_ms: bundled - started,
      componentize_ms: Date.now() - bundled,
    }),
  );
} catch (e) {
  console.error(`wasmkeep build: ${e?.message ?? e}`);
  process.exitCode = 1;
} finally {
  await rm(work, { recursive: true, force: true });
}
