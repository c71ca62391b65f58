// `pinger`: actor-to-actor messages through the outbox, the routes and
// answers of the Rust example.
//
// - `POST /ping?to={other}&n={k}` sends `k` messages to `pinger/{other}`;
//   answers `{"queued":k,"seqs":[first,last]}`.
// - `GET /pongs`: `{"sent":S,"answered":A,"duplicates":D}` (D stays 0).
// - `GET /stats`: `{"received":R,"received_twice":T,"failed":F}`.
// - `POST /fetch?url={u}&n={k}`: `k` outbound `GET`s; `GET /calls`: the
//   answers so far. `GET /latencies`: `{"pings":[[sent,answered]...],"calls":[...]}`.
// - `POST /relay?to={other}`: parks the reply, sends one message, and
//   answers the client from the event that applies the answer:
//   `relayed: pong {n}`. `POST /park?ms={t}` parks its reply until
//   `POST /complete-parked` completes it.
// - `GET /config?name=N`: `{"value": V|null}`; `POST /config/log?name=N`
//   also logs it.
//
// With `fail=1`, `/ping` and `/fetch` send and then fail: nothing leaves.

import { Actor, Message, OutboxResponse, Request, Response, WasmkeepError, config, id, kv, log, nowMs, outbox, replies, sql, to } from "@wasmkeep/sdk";

/** What a send remembers until its answer (carried as JSON). */
type Ctx = { ping: number } | { fetch: string } | { relay: string; fail: boolean };

/** Most messages one request may send. */
const PINGS_PER_REQUEST_MAX = 1_000;

function count(statement: string): number {
  return sql.exec(statement).raw()[0][0] as number;
}

function howMany(req: Request): number {
  const n = req.queryInt("n") ?? 1;
  if (n === 0 || n > PINGS_PER_REQUEST_MAX) {
    throw WasmkeepError.badRequest(`\`n\` must be 1 to ${PINGS_PER_REQUEST_MAX}`);
  }
  return n;
}

function required(req: Request, name: string): string {
  const v = req.queryParam(name);
  if (v === undefined) throw WasmkeepError.badRequest(`\`${name}\` is required`);
  return v;
}

const decoder = new TextDecoder();

export class Pinger implements Actor {
  init(): void {
    sql.run(
      "CREATE TABLE pings (seq INTEGER PRIMARY KEY, n INTEGER NOT NULL, answered INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0, sent_ms INTEGER NOT NULL, answered_ms INTEGER)",
    );
    sql.run("CREATE TABLE dup_answers (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)");
    sql.run("INSERT INTO dup_answers VALUES (0, 0)");
    sql.run("CREATE TABLE received (body TEXT PRIMARY KEY, times INTEGER NOT NULL)");
    sql.run(
      "CREATE TABLE calls (seq INTEGER PRIMARY KEY, status INTEGER, body TEXT, code TEXT, sent_ms INTEGER NOT NULL, answered_ms INTEGER)",
    );
  }

  request(req: Request): Response {
    const fail = req.queryParam("fail") === "1";
    switch (req.route) {
      case "POST /ping": {
        const target = to("pinger", required(req, "to"));
        const n = howMany(req);
        const me = id().name;
        const base = count("SELECT count(*) FROM pings");
        let first = 0;
        let last = 0;
        for (let i = 0; i < n; i++) {
          const k = base + i + 1;
          const seq = outbox.send<Ctx>(target, `${me}:${k}`, { ping: k });
          sql.run("INSERT INTO pings (seq, n, sent_ms) VALUES (?1, ?2, ?3)", seq, k, nowMs());
          if (i === 0) first = seq;
          last = seq;
        }
        if (fail) throw new WasmkeepError("asked_to_fail", "failing after the sends, as asked");
        return Response.json({ queued: n, seqs: [first, last] });
      }
      case "POST /fetch": {
        const url = required(req, "url");
        const n = howMany(req);
        let seq = 0;
        for (let i = 0; i < n; i++) {
          seq = outbox.fetch<Ctx>({ url, headers: [["x-wasmkeep-example", "pinger"]] }, { fetch: url });
          sql.run("INSERT INTO calls (seq, sent_ms) VALUES (?1, ?2)", seq, nowMs());
        }
        if (fail) throw new WasmkeepError("asked_to_fail", "failing after the call, as asked");
        return Response.json({ seq });
      }
      case "POST /relay": {
        const other = required(req, "to");
        const ticket = replies.park(req.queryInt("ms") ?? 30_000);
        outbox.send<Ctx>(to("pinger", other), `${id().name}:relay-${ticket}`, { relay: ticket, fail });
        return Response.status(202);
      }
      case "POST /park":
        kv.put("parked_ticket", replies.park(req.queryInt("ms") ?? 100));
        return Response.status(202);
      case "POST /complete-parked": {
        const ticket = kv.getText("parked_ticket");
        if (ticket === undefined) throw WasmkeepError.notFound("nothing parked");
        replies.complete(ticket, Response.text("completed by a later request"));
        return Response.status(204);
      }
      case "GET /config":
      case "POST /config/log": {
        const name = required(req, "name");
        const value = config.get(name);
        if (req.method === "POST") log.info(`config ${name} = ${value ?? "(none)"}`);
        return Response.json({ value: value ?? null });
      }
      case "GET /calls": {
        const calls = sql.exec("SELECT seq, status, body, code FROM calls WHERE answered_ms IS NOT NULL ORDER BY seq").toArray();
        return Response.json({ calls });
      }
      case "GET /pongs":
        return Response.json({
          sent: count("SELECT count(*) FROM pings"),
          answered: count("SELECT count(*) FROM pings WHERE answered > 0"),
          duplicates: count("SELECT n FROM dup_answers WHERE id = 0"),
        });
      case "GET /latencies": {
        const pairs = (q: string) => sql.exec(q).raw();
        return Response.json({
          pings: pairs("SELECT sent_ms, answered_ms FROM pings WHERE answered_ms IS NOT NULL"),
          calls: pairs("SELECT sent_ms, answered_ms FROM calls WHERE answered_ms IS NOT NULL AND status = 200"),
        });
      }
      case "GET /stats":
        return Response.json({
          received: count("SELECT count(*) FROM received"),
          received_twice: count("SELECT count(*) FROM received WHERE times > 1"),
          failed: count("SELECT count(*) FROM pings WHERE failed > 0"),
        });
      default:
        return Response.notFound();
    }
  }

  message(msg: Message): string {
    const body = msg.text();
    sql.run("INSERT INTO received (body, times) VALUES (?1, 1) ON CONFLICT (body) DO UPDATE SET times = times + 1", body);
    return `pong ${body.split(":").pop() ?? "?"}`;
  }

  response(r: OutboxResponse): void {
    const ctx = r.context as Ctx | undefined;
    if (ctx === undefined || typeof ctx !== "object") return;
    if ("relay" in ctx) {
      const text = r.answer.kind === "reply" ? `relayed: ${decoder.decode(r.answer.body)}` : `relay failed: ${JSON.stringify(r.answer)}`;
      replies.complete(ctx.relay, Response.text(text));
      if (ctx.fail) throw new WasmkeepError("asked_to_fail", "failing after completing, as asked");
      return;
    }
    if ("fetch" in ctx) {
      const a = r.answer;
      const [status, body, code] =
        a.kind === "http"
          ? [a.status, decoder.decode(a.body), ""]
          : a.kind === "reply"
            ? [0, "", "unexpected"]
            : [0, a.error.message, a.error.code];
      sql.run("UPDATE calls SET status = ?2, body = ?3, code = ?4, answered_ms = ?5 WHERE seq = ?1", r.seq, status, body, code, nowMs());
      return;
    }
    const already = sql.exec("SELECT answered + failed FROM pings WHERE seq = ?1", r.seq).raw()[0];
    if (already !== undefined && (already[0] as number) > 0) {
      sql.run("UPDATE dup_answers SET n = n + 1 WHERE id = 0");
      return;
    }
    const ok = r.answer.kind === "reply" && decoder.decode(r.answer.body) === `pong ${ctx.ping}`;
    sql.run(`UPDATE pings SET ${ok ? "answered" : "failed"} = 1, answered_ms = ?2 WHERE seq = ?1`, r.seq, nowMs());
  }
}
