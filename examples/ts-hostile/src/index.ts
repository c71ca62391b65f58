// A TypeScript actor that attacks the node running it (class `attacker`),
// for the hostile-guest tests in JavaScript (crates/wasmkeep/tests/hostile_ts.rs).
// Each route is one attack; the node must end each with its named error
// while its neighbours keep answering.
//
// - `POST /spin`: an infinite loop (the event's CPU deadline ends it).
// - `POST /recurse`: unbounded recursion.
// - `POST /big-string`: a string of 2 GiB.
// - `POST /memory-bomb`: keeps 1 MiB buffers until memory runs out.
// - `POST /async`: an `async` handler (a handler that would await).
// - `POST /fetch`: calls `fetch` (a handler that would wait on the network).
// - `GET /ping`: `{"ok":true}`, to show the actor still serves.
//
// It also carries one SDK check no example uses (the test kit's
// tests/typescript.rs): `POST /apply-if?seen=G` bumps a generation that
// starts at 1 only if it still is G (`sql.applyIfUnchanged`), and answers
// `{"applied":bool,"generation":N}`.

import { Actor, Request, Response, app, sql } from "@wasmkeep/sdk";

const kept: Uint8Array[] = [];

function recurse(n: number): number {
  return recurse(n + 1) + 1;
}

class Attacker implements Actor {
  request(req: Request): Response {
    switch (req.route) {
      case "POST /spin": {
        let i = 0;
        for (;;) i++;
      }
      case "POST /recurse":
        return Response.json({ depth: recurse(0) });
      case "POST /big-string": {
        const s = "x".repeat(2 ** 31);
        return Response.json({ length: s.length });
      }
      case "POST /memory-bomb": {
        for (;;) {
          const b = new Uint8Array(1 << 20);
          b.fill(1);
          kept.push(b);
        }
      }
      case "POST /async":
        return (async () => Response.json({ awaited: true }))() as unknown as Response;
      case "POST /fetch": {
        const f = (globalThis as unknown as { fetch: (url: string) => unknown }).fetch;
        f("http://example.com/");
        return Response.json({ fetched: true });
      }
      case "POST /apply-if": {
        sql.run("CREATE TABLE IF NOT EXISTS g (id INTEGER PRIMARY KEY CHECK (id = 0), generation INTEGER NOT NULL)");
        sql.run("INSERT OR IGNORE INTO g VALUES (0, 1)");
        const applied = sql.applyIfUnchanged("SELECT generation FROM g WHERE id = 0", [], req.queryInt("seen") ?? 0, () => {
          sql.run("UPDATE g SET generation = generation + 1 WHERE id = 0");
        });
        return Response.json({ applied, generation: sql.one<{ generation: number }>("SELECT generation FROM g").generation });
      }
      case "GET /ping":
        return Response.json({ ok: true, kept: kept.length });
      default:
        return Response.notFound();
    }
  }
}

export default app({ attacker: Attacker });
