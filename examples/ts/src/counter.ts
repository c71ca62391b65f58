// `counter`: the benchmark workload W1, as the Rust example.
//
// - `POST /increment` answers `{"value":N}` after adding one.
// - `GET /value` answers `{"value":N}`.
// - `GET /bookmark[?at_ms=T]`, `POST /restore?bookmark=B`: as the Rust one.

import { Actor, Request, Response, WasmkeepError, bookmarks, sql } from "@wasmkeep/sdk";

export class Counter implements Actor {
  init(): void {
    sql.run("CREATE TABLE counter (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)");
    sql.run("INSERT INTO counter VALUES (0, 0)");
  }

  request(req: Request): Response {
    let statement: string;
    switch (req.route) {
      case "POST /increment":
        statement = "UPDATE counter SET n = n + 1 WHERE id = 0 RETURNING n";
        break;
      case "GET /value":
        statement = "SELECT n FROM counter WHERE id = 0";
        break;
      case "GET /bookmark": {
        const at = req.queryInt("at_ms");
        return Response.json({ bookmark: at === undefined ? bookmarks.current() : bookmarks.forTime(at) });
      }
      case "POST /restore": {
        const b = req.queryParam("bookmark");
        if (b === undefined) throw WasmkeepError.badRequest("`bookmark` is required");
        return Response.json({ undo: bookmarks.restoreOnNextStart(b) });
      }
      default:
        return Response.notFound();
    }
    return Response.json({ value: sql.one<{ n: number }>(statement).n });
  }
}
