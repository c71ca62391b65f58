// `reminder`: alarms, with the routes and answers of the Rust example
// (the acceptance checks and W2 run against either).
//
// - `POST /set?at_ms=T[&fail_times=K][&every_ms=P&count=N]`: set the alarm
//   for T. The alarm handler fails while its retry count is below K. With
//   `every_ms`, a successful run re-arms at the anchor T plus a multiple
//   of P (never from "now") until N runs have succeeded.
// - `GET /alarm`: `{"alarm":T}` or `{"alarm":null}`; `DELETE /alarm` clears it.
// - `GET /fired`: `{"fired":[{"due_ms","fired_ms","retry_count","is_retry","alarm_in_handler"}]}`.

import { Actor, AlarmInfo, Request, Response, WasmkeepError, alarm, nowMs, sql } from "@wasmkeep/sdk";

interface Plan {
  anchor_ms: number;
  fail_times: number;
  every_ms: number;
  count: number;
  runs_ok: number;
  [column: string]: number;
}

export class Reminder implements Actor {
  init(): void {
    sql.run(
      "CREATE TABLE plan (id INTEGER PRIMARY KEY CHECK (id = 0), anchor_ms INTEGER NOT NULL, fail_times INTEGER NOT NULL, every_ms INTEGER NOT NULL, count INTEGER NOT NULL, runs_ok INTEGER NOT NULL)",
    );
    sql.run(
      "CREATE TABLE fired (seq INTEGER PRIMARY KEY, due_ms INTEGER NOT NULL, fired_ms INTEGER NOT NULL, retry_count INTEGER NOT NULL, is_retry INTEGER NOT NULL, alarm_in_handler INTEGER)",
    );
  }

  request(req: Request): Response {
    switch (req.route) {
      case "POST /set": {
        const at = req.queryInt("at_ms");
        if (at === undefined) throw WasmkeepError.badRequest("query parameter `at_ms` is required");
        const failTimes = req.queryInt("fail_times") ?? 0;
        const everyMs = req.queryInt("every_ms") ?? 0;
        const count = Math.max(req.queryInt("count") ?? 1, 1);
        sql.run("INSERT OR REPLACE INTO plan VALUES (0, ?1, ?2, ?3, ?4, 0)", at, failTimes, everyMs, count);
        alarm.set(at);
        return Response.json({ alarm: at });
      }
      case "GET /alarm":
        return Response.json({ alarm: alarm.get() ?? null });
      case "DELETE /alarm":
        alarm.delete();
        return Response.json({ alarm: null });
      case "GET /fired": {
        const fired = sql
          .exec<{ due_ms: number; fired_ms: number; retry_count: number; is_retry: number; alarm_in_handler: number | null }>(
            "SELECT due_ms, fired_ms, retry_count, is_retry, alarm_in_handler FROM fired ORDER BY seq",
          )
          .toArray()
          .map((r) => ({ ...r, is_retry: r.is_retry !== 0 }));
        return Response.json({ fired });
      }
      default:
        return Response.notFound();
    }
  }

  alarm(info: AlarmInfo): void {
    const inHandler = alarm.get();
    const plan = sql.exec<Plan>("SELECT anchor_ms, fail_times, every_ms, count, runs_ok FROM plan WHERE id = 0").toArray()[0] ?? {
      anchor_ms: info.scheduledMs,
      fail_times: 0,
      every_ms: 0,
      count: 1,
      runs_ok: 0,
    };
    if (info.retryCount < plan.fail_times) {
      throw new WasmkeepError("planned_failure", `failing as asked: retry ${info.retryCount} of ${plan.fail_times}`);
    }
    sql.run(
      "INSERT INTO fired (due_ms, fired_ms, retry_count, is_retry, alarm_in_handler) VALUES (?1, ?2, ?3, ?4, ?5)",
      info.scheduledMs,
      nowMs(),
      info.retryCount,
      info.isRetry,
      inHandler ?? null,
    );
    const runsOk = plan.runs_ok + 1;
    sql.run("UPDATE plan SET runs_ok = ?1 WHERE id = 0", runsOk);
    if (plan.every_ms > 0 && runsOk < plan.count) {
      // From the fixed anchor: a late run does not push the schedule.
      alarm.set(plan.anchor_ms + runsOk * plan.every_ms);
    }
  }
}
