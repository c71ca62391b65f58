// `waiter`: waits for answers inside its handlers (`awaits`, ADR 0056),
// with the routes and answers of the Rust example
// (`examples/demo/src/waiter.rs`) but its `/behind`. Nothing else of a waiter runs while it
// waits; each note it writes before a wait is written once, however many
// times the handler ran.
//
// - `POST /add?name=N&by=K[&within=MS]`: `{"total":T,"notes":C}`.
// - `POST /twice?name=N`: `{"first":A,"second":B}`.
// - `POST /fetch?url=U[&within=MS]` (or `GET`): `{"status":S,"body":B}`.
// - `POST /self`: waits for its own answer (refused: `await_deadlock`).
// - `POST /nondet?name=N`: waits for `add(R)`, R this instance's runs of
//   the route: a second run asks for another call (`await_nondeterministic`).
// - `POST /ask?to=N`: `{"answer":A}`; a waiter answers `hello from NAME`.
// - `POST /arm?name=N&by=K`: its alarm, for now, waits for `add(K)`.
// - `GET /notes`: `{"notes":[{"what":W,"at_ms":T}]}`.

import { Actor, Request, Response, WasmkeepError, Message, alarm, awaits, calls, id, nowMs, sql } from "@wasmkeep/sdk";
import { TallyApi } from "./calls";

const decoder = new TextDecoder();
const encoder = new TextEncoder();

function note(what: string): void {
  sql.run("INSERT INTO notes (what, at_ms) VALUES (?1, ?2)", what, nowMs());
}

function param(req: Request, name: string): string {
  const v = req.queryParam(name);
  if (v === undefined) throw WasmkeepError.badRequest(`\`${name}\` is required`);
  return v;
}

function tally(name: string, withinMs = 0) {
  return calls.wait<TallyApi>("tally_api", { app: id().app, class: "tally", name }, withinMs);
}

export class Waiter implements Actor {
  /** Memory, which a run does not roll back and the next does not repeat. */
  runs = 0;

  init(): void {
    sql.run("CREATE TABLE notes (id INTEGER PRIMARY KEY, what TEXT NOT NULL, at_ms INTEGER NOT NULL)");
    sql.run("CREATE TABLE armed (id INTEGER PRIMARY KEY CHECK (id = 0), name TEXT NOT NULL, by INTEGER NOT NULL)");
  }

  request(req: Request): Response {
    const within = req.queryInt("within") ?? 0;
    switch (req.route) {
      case "POST /add": {
        const by = req.queryInt("by");
        if (by === undefined) throw WasmkeepError.badRequest("`by` is an integer");
        note("before add");
        const total = tally(param(req, "name"), within).add({ by });
        note(`after add ${total}`);
        const notes = sql.one<{ n: number }>("SELECT count(*) AS n FROM notes").n;
        return Response.json({ total, notes });
      }
      case "POST /twice": {
        const t = tally(param(req, "name"));
        const first = t.add({ by: 1 });
        const second = t.add({ by: 2 });
        return Response.json({ first, second });
      }
      case "GET /fetch":
      case "POST /fetch": {
        note("before fetch");
        const h = awaits.fetch({ url: param(req, "url") }, within);
        note(`after fetch ${h.status}`);
        return Response.json({ status: h.status, body: decoder.decode(h.body) });
      }
      case "POST /nondet": {
        this.runs += 1;
        return Response.json({ total: tally(param(req, "name")).add({ by: this.runs }) });
      }
      case "POST /self": {
        const me = id();
        awaits.message({ app: me.app, class: me.class, name: me.name }, "hello");
        return Response.status(204);
      }
      case "POST /ask": {
        const answer = awaits.message({ app: id().app, class: "waiter", name: param(req, "to") }, "hi");
        return Response.json({ answer: decoder.decode(answer) });
      }
      case "POST /arm": {
        sql.run("INSERT OR REPLACE INTO armed VALUES (0, ?1, ?2)", param(req, "name"), req.queryInt("by") ?? 1);
        alarm.set(nowMs());
        return Response.status(204);
      }
      case "GET /notes":
        return Response.json({ notes: sql.exec<{ what: string; at_ms: number }>("SELECT what, at_ms FROM notes ORDER BY id").toArray() });
      default:
        return Response.status(404);
    }
  }

  message(_msg: Message): Uint8Array {
    return encoder.encode(`hello from ${id().name}`);
  }

  alarm(): void {
    const r = sql.exec<{ name: string; by: number }>("SELECT name, by FROM armed WHERE id = 0").toArray()[0];
    if (r === undefined) return;
    const total = tally(r.name).add({ by: r.by });
    note(`alarm ${total}`);
  }
}
