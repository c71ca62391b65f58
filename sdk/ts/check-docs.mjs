#!/usr/bin/env node
// Type-checks every ```ts block of the TypeScript docs against this SDK,
// each block as a module of its own: the examples in docs/typescript.md,
// sdk/ts/README.md and the README's "Actors in TypeScript" compile, or
// `scripts/test.sh` fails with tsc's message naming the block.
//
//   node check-docs.mjs

import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "..", "..");
const docs = ["docs/typescript.md", "sdk/ts/README.md", "README.md"];
const work = mkdtempSync(join(tmpdir(), "wasmkeep-doc-ts-"));
try {
  const files = [];
  for (const doc of docs) {
    const text = readFileSync(join(root, doc), "utf8");
    const blocks = [...text.matchAll(/^```ts\n([\s\S]*?)^```$/gm)];
    blocks.forEach((m, i) => {
      const line = text.slice(0, m.index).split("\n").length;
      const name = `${doc.replace(/[/.]/g, "_")}_${i + 1}_line${line}.ts`;
      // Each block is a module (an `export {}` makes one of a fragment).
      writeFileSync(join(work, name), `${m[1]}\nexport {};\n`);
      files.push(name);
    });
  }
  writeFileSync(
    join(work, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        module: "ES2022",
        moduleResolution: "bundler",
        lib: ["ES2022"],
        strict: true,
        noEmit: true,
        isolatedModules: true,
        noUnusedLocals: false,
        baseUrl: ".",
        paths: { "@wasmkeep/sdk": [relative(work, join(here, "src", "index.ts"))] },
      },
      files,
    }),
  );
  try {
    execFileSync(join(here, "node_modules", ".bin", "tsc"), ["-p", work], { stdio: "inherit" });
    console.log(`check-docs: ${files.length} TypeScript examples type-checked`);
  } catch {
    console.error(`check-docs: a TypeScript example in the docs does not compile (files in ${work} are named by doc and line)`);
    process.exitCode = 1;
  }
} finally {
  if (process.exitCode !== 1) rmSync(work, { recursive: true, force: true });
}
