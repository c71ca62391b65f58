// `profiles`: schema migrations, as the Rust example (its header says
// more). The manifest's `PROFILE_SCHEMA` picks how many of the class's
// migrations a deploy lists (`1`, unset or `2`, `bad`: a third that
// fails), so that one build plays successive deploys in the tests. A real
// class lists its migrations as a constant and only appends to it.
//
// - `PUT /?name=N[&email=E]` stores the profile (`email` from schema 2 on).
// - `GET /`: `{"name":N|null,"email":E|null,"schema":V}`.

import { Actor, Request, Response, WasmkeepError, config, schema, sql } from "@wasmkeep/sdk";

const MIGRATIONS = [
  "CREATE TABLE profile (id INTEGER PRIMARY KEY CHECK (id = 0), name TEXT NOT NULL)",
  "ALTER TABLE profile ADD COLUMN email TEXT",
  "ALTER TABLE no_such_table ADD COLUMN broken TEXT",
];

export class Profiles implements Actor {
  static get migrations(): readonly string[] {
    switch (config.get("PROFILE_SCHEMA")) {
      case "1":
        return MIGRATIONS.slice(0, 1);
      case "bad":
        return MIGRATIONS;
      default:
        return MIGRATIONS.slice(0, 2);
    }
  }

  request(req: Request): Response {
    const version = schema.version();
    switch (req.route) {
      case "PUT /": {
        const name = req.queryParam("name");
        if (name === undefined) throw WasmkeepError.badRequest("`name` is required");
        const email = req.queryParam("email");
        if (version < 2 && email !== undefined) throw WasmkeepError.badRequest("`email` needs schema version 2");
        sql.run("INSERT INTO profile (id, name) VALUES (0, ?1) ON CONFLICT (id) DO UPDATE SET name = excluded.name", name);
        if (email !== undefined) sql.run("UPDATE profile SET email = ?1 WHERE id = 0", email);
        return Response.status(204);
      }
      case "GET /": {
        const select =
          version < 2
            ? "SELECT name, NULL AS email FROM profile WHERE id = 0"
            : "SELECT name, email FROM profile WHERE id = 0";
        const row = sql.exec<{ name: string; email: string | null }>(select).toArray()[0];
        return Response.json({ name: row?.name ?? null, email: row?.email ?? null, schema: version });
      }
      default:
        return Response.notFound();
    }
  }
}
