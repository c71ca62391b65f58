// `timers`: named timers and cron schedules on the actor's one alarm,
// with the routes and answers of the Rust example (`examples/demo/src/timers.rs`),
// so that the same tests run against either.
//
// - `POST /set?name=N&due_ms=T` with the payload as body: 204.
// - `POST /cancel?name=N`: `{"cancelled":bool}`.
// - `GET /timers`: `{"alarm_ms":T|null,"timers":[{"name","due_ms","payload"}]}`.
// - `GET /fired`: `{"fired":[{"name","due_ms","fired_ms","payload"}]}` in the
//   order they ran. A timer whose name starts with `fail` makes the alarm's
//   first run fail.
// - `POST /cron?name=N&expr=E&zone=Z`: `{"next_ms":T}`.
// - `POST /cron/cancel?name=N`: `{"cancelled":bool}`.
// - `GET /cron`: `{"schedules":[{"name","expression","zone","next_ms"}]}`.
// - `GET /cron/runs`: `{"runs":[{"name","scheduled_ms","ran_ms","missed"}]}`;
//   `GET /cron/history?name=N`: `{"history":[{"scheduled_ms","ran_ms","missed"}]}`.

import { Actor, AlarmInfo, Request, Response, WasmkeepError, alarm, cron, nowMs, sql, timers } from "@wasmkeep/sdk";

function nameOf(req: Request): string {
  const name = req.queryParam("name");
  if (name === undefined) throw WasmkeepError.badRequest("`name` is required");
  return name;
}

export class Timers implements Actor {
  init(): void {
    sql.run(
      "CREATE TABLE fired (seq INTEGER PRIMARY KEY, name TEXT NOT NULL, due_ms INTEGER NOT NULL, fired_ms INTEGER NOT NULL, payload TEXT NOT NULL)",
    );
    sql.run(
      "CREATE TABLE cron_runs (seq INTEGER PRIMARY KEY, name TEXT NOT NULL, scheduled_ms INTEGER NOT NULL, ran_ms INTEGER NOT NULL, missed INTEGER NOT NULL)",
    );
  }

  request(req: Request): Response {
    switch (req.route) {
      case "POST /set": {
        const due = req.queryInt("due_ms");
        if (due === undefined) throw WasmkeepError.badRequest("`due_ms` is required");
        timers.set(nameOf(req), due, req.body);
        return Response.status(204);
      }
      case "POST /cancel":
        return Response.json({ cancelled: timers.cancel(nameOf(req)) });
      case "GET /timers": {
        const list = timers.list().map((t) => ({ name: t.name, due_ms: t.dueMs, payload: new TextDecoder().decode(t.payload) }));
        return Response.json({ alarm_ms: alarm.get() ?? null, timers: list });
      }
      case "GET /fired":
        return Response.json({ fired: sql.exec("SELECT name, due_ms, fired_ms, payload FROM fired ORDER BY seq").toArray() });
      case "POST /cron": {
        const expr = req.queryParam("expr");
        if (expr === undefined) throw WasmkeepError.badRequest("`expr` is required");
        return Response.json({ next_ms: cron.schedule(nameOf(req), expr, req.queryParam("zone") ?? "UTC", req.body) });
      }
      case "POST /cron/cancel":
        return Response.json({ cancelled: cron.cancel(nameOf(req)) });
      case "GET /cron": {
        const schedules = cron.list().map((s) => ({ name: s.name, expression: s.expression, zone: s.zone, next_ms: s.nextMs }));
        return Response.json({ schedules });
      }
      case "GET /cron/runs":
        return Response.json({ runs: sql.exec("SELECT name, scheduled_ms, ran_ms, missed FROM cron_runs ORDER BY seq").toArray() });
      case "GET /cron/history": {
        const history = cron.history(nameOf(req)).map((r) => ({ scheduled_ms: r.scheduledMs, ran_ms: r.ranMs, missed: r.missed }));
        return Response.json({ history });
      }
      default:
        return Response.notFound();
    }
  }

  alarm(info: AlarmInfo): void {
    const now = nowMs();
    for (const run of cron.takeDue(now)) {
      sql.run("INSERT INTO cron_runs (name, scheduled_ms, ran_ms, missed) VALUES (?1, ?2, ?3, ?4)", run.name, run.scheduledMs, now, run.missed);
    }
    for (const t of timers.takeDue(now)) {
      if (t.name.startsWith("fail") && info.retryCount === 0) {
        throw new WasmkeepError("timer_failed", `\`${t.name}\` fails the first run`);
      }
      sql.run("INSERT INTO fired (name, due_ms, fired_ms, payload) VALUES (?1, ?2, ?3, ?4)", t.name, t.dueMs, now, new TextDecoder().decode(t.payload));
    }
  }
}
