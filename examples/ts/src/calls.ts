// `tally` and `caller`: typed calls between actors (`calls`), with the
// routes and answers of the Rust example (`examples/demo/src/calls.rs`)
// and its wire format: a TypeScript caller calls a Rust tally and back.
//
// `tally` answers `tally_api` (add, get, fail) and `GET /value`.
// `caller`: `POST /add?name=N&by=K&note=X[&app=A]`, `POST /get?...`,
// `POST /fail?...&code=C`, and `POST /nope?...` (a method no tally has);
// `GET /replies`: `{"replies":[{"method","ok","value","code","note"}]}`.

import { Actor, Message, OutboxResponse, Request, Response, WasmkeepError, calls, id, nowMs, sql } from "@wasmkeep/sdk";

/** What a tally answers to other actors. */
export interface TallyApi {
  add(args: { by: number }): number;
  get(args: Record<string, never>): number;
  fail(args: { code: string }): number;
}

const TALLY_API = "tally_api";

export class Tally implements Actor {
  init(): void {
    sql.run("CREATE TABLE tally (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)");
    sql.run("INSERT INTO tally VALUES (0, 0)");
  }

  /** The implementation, apart from the actor's own hooks. */
  readonly api: TallyApi = {
    add: ({ by }) => {
      if (!Number.isSafeInteger(by)) throw new WasmkeepError("bad_arguments", "`by` is an integer");
      return sql.one<{ n: number }>("UPDATE tally SET n = n + ?1 WHERE id = 0 RETURNING n", by).n;
    },
    get: () => sql.one<{ n: number }>("SELECT n FROM tally WHERE id = 0").n,
    fail: ({ code }) => {
      sql.run("UPDATE tally SET n = n + 1000 WHERE id = 0");
      throw new WasmkeepError(code, "asked to fail");
    },
  };

  request(req: Request): Response {
    if (req.route === "GET /value") return Response.json({ value: this.api.get({}) });
    return Response.notFound();
  }

  message(msg: Message): Uint8Array {
    return calls.serve<TallyApi>(TALLY_API, msg, this.api);
  }
}

function param(req: Request, name: string): string {
  const v = req.queryParam(name);
  if (v === undefined) throw WasmkeepError.badRequest(`\`${name}\` is required`);
  return v;
}

export class Caller implements Actor {
  init(): void {
    sql.run(
      "CREATE TABLE replies (seq INTEGER PRIMARY KEY, method TEXT NOT NULL, ok INTEGER NOT NULL, value INTEGER, code TEXT, note TEXT NOT NULL, answered_ms INTEGER NOT NULL)",
    );
  }

  request(req: Request): Response {
    if (req.route === "GET /replies") {
      const replies = sql
        .exec<{ method: string; ok: number; value: number | null; code: string | null; note: string; answered_ms: number }>(
          "SELECT method, ok, value, code, note, answered_ms FROM replies ORDER BY seq",
        )
        .toArray()
        .map((r) => ({ ...r, ok: r.ok !== 0 }));
      return Response.json({ replies });
    }
    const tally = calls.client<TallyApi, string>(TALLY_API, {
      app: req.queryParam("app") ?? id().app,
      class: "tally",
      name: param(req, "name"),
    });
    const note = req.queryParam("note") ?? String(nowMs());
    let seq = 0;
    switch (req.route) {
      case "POST /add": {
        const n = Math.min(Math.max(req.queryInt("n") ?? 1, 1), 100);
        for (let i = 0; i < n; i++) seq = tally.add({ by: Number(param(req, "by")) }, note);
        break;
      }
      case "POST /get":
        seq = tally.get({}, note);
        break;
      case "POST /fail":
        seq = tally.fail({ code: param(req, "code") }, note);
        break;
      case "POST /nope":
        // A method the declared interface lacks, as a caller built against
        // a newer interface would send it.
        seq = (tally as unknown as Record<string, (a: object, c: string) => number>).reset({}, note);
        break;
      default:
        return Response.notFound();
    }
    return Response.json({ seq });
  }

  response(r: OutboxResponse): void {
    const reply = calls.reply<TallyApi, string>(TALLY_API, r);
    if (reply === undefined) return;
    sql.run(
      "INSERT INTO replies (method, ok, value, code, note, answered_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
      String(reply.method),
      reply.ok ? 1 : 0,
      reply.ok ? (reply.value as number) : null,
      reply.ok ? null : reply.error.code,
      reply.context,
      nowMs(),
    );
  }
}
