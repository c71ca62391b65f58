// `files`: values larger than a row (`blobs`), with the routes and
// answers of the Rust example (`examples/demo/src/files.rs`).
//
// - `PUT /blob?name=N` with the bytes as body: `{"size":S}` (replaces).
// - `POST /blob/append?name=N` with the next part as body: `{"size":S}`.
// - `GET /blob?name=N`: the bytes; with `&offset=O&len=L`, that range.
// - `GET /blob/size?name=N`: `{"size":S|null}`.
// - `DELETE /blob?name=N`: `{"deleted":bool}`.
// - `GET /blobs?prefix=P`: `{"blobs":[{"name","size"}]}` by name.
// - `PUT /kv?key=K`, `GET /kv?prefix=P`, `DELETE /kv?prefix=P`,
//   `DELETE /kv/all`, `POST /tables`, `GET /tables`, `POST /alarm?at=MS`,
//   `GET /alarm`, `GET /size`, `POST /wipe`, `POST /id`: the actor's
//   storage as a whole, as in the Rust example.

import { Actor, Request, Response, WasmkeepError, alarm, blobs, deleteAll, kv, sql, uniqueId } from "@wasmkeep/sdk";

function nameOf(req: Request): string {
  const name = req.queryParam("name");
  if (name === undefined) throw WasmkeepError.badRequest("`name` is required");
  return name;
}

export class Files implements Actor {
  request(req: Request): Response {
    switch (req.route) {
      case "PUT /blob": {
        const name = nameOf(req);
        blobs.put(name, req.body);
        return Response.json({ size: blobs.size(name) });
      }
      case "POST /blob/append":
        return Response.json({ size: blobs.append(nameOf(req), req.body) });
      case "GET /blob": {
        const name = nameOf(req);
        const offset = req.queryInt("offset");
        if (offset !== undefined) {
          const len = req.queryInt("len") ?? Number.MAX_SAFE_INTEGER;
          return new Response(200, [["content-type", "application/octet-stream"]], blobs.read(name, offset, len));
        }
        blobs.writeResponseBody(name);
        return new Response(200, [["content-type", "application/octet-stream"]]);
      }
      case "GET /blob/size":
        return Response.json({ size: blobs.size(nameOf(req)) ?? null });
      case "DELETE /blob":
        return Response.json({ deleted: blobs.delete(nameOf(req)) });
      case "GET /blobs":
        return Response.json({ blobs: blobs.list(req.queryParam("prefix") ?? "") });
      default:
        return storage(req);
    }
  }
}

/** The routes over the actor's storage as a whole. */
function storage(req: Request): Response {
  const prefix = req.queryParam("prefix") ?? "";
  switch (req.route) {
    case "PUT /kv": {
      const key = req.queryParam("key");
      if (key === undefined) throw WasmkeepError.badRequest("`key` is required");
      kv.put(key, req.body);
      return Response.json({});
    }
    case "GET /kv":
      return Response.json({ keys: kv.list({ prefix }).map(([k]) => k) });
    case "DELETE /kv":
      return Response.json({ deleted: kv.deletePrefix(prefix) });
    case "DELETE /kv/all":
      return Response.json({ deleted: kv.deleteAll() });
    case "POST /tables":
      for (const statement of [
        "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY)",
        "CREATE TABLE IF NOT EXISTS child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent(id))",
        "CREATE VIEW IF NOT EXISTS children AS SELECT child.id FROM child JOIN parent ON parent.id = child.parent_id",
        "INSERT OR IGNORE INTO parent (id) VALUES (1)",
        "INSERT OR IGNORE INTO child (id, parent_id) VALUES (1, 1)",
      ]) {
        sql.run(statement);
      }
      return Response.json({});
    case "GET /tables": {
      const names = (kind: string): string[] =>
        sql
          .exec<{ name: string }>(
            "SELECT name FROM sqlite_schema WHERE type = ? AND name NOT LIKE '\\_wasmkeep\\_%' ESCAPE '\\' ORDER BY name",
            kind,
          )
          .toArray()
          .map((r) => r.name);
      return Response.json({ tables: names("table"), views: names("view") });
    }
    case "POST /alarm": {
      const at = req.queryInt("at");
      if (at === undefined) throw WasmkeepError.badRequest("`at` is required");
      alarm.set(at);
      return Response.json({});
    }
    case "GET /alarm":
      return Response.json({ at: alarm.get() ?? null });
    case "GET /size":
      return Response.json({ bytes: sql.databaseSize() });
    case "POST /wipe":
      deleteAll();
      return Response.json({ bytes: sql.databaseSize() });
    case "POST /id":
      return Response.json({ id: uniqueId() });
    default:
      return Response.notFound();
  }
}
