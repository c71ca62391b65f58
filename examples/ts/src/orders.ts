// `orders`: durable workflows (`workflow`), with the routes, answers and
// workflows of the Rust example (`examples/demo/src/orders.rs`): `order`
// (reserve, cool-off, approval, ship) and `ten` (steps s0 .. s9). Every
// `run` step counts its effect in `effects`.

import { Actor, AlarmInfo, Message, OutboxResponse, Request, Response, StepContext, WasmkeepError, WorkflowDef, id, sql, workflow } from "@wasmkeep/sdk";

function effect(name: string): void {
  sql.run("INSERT INTO effects (step, n) VALUES (?1, 1) ON CONFLICT (step) DO UPDATE SET n = n + 1", name);
}

const ORDER: WorkflowDef = {
  name: "order",
  steps: [
    workflow.run("reserve", (ctx: StepContext) => {
      const fail = Number((ctx.input as { fail?: number }).fail ?? 0);
      effect("reserve");
      if (ctx.attempt <= fail) throw new WasmkeepError("out_of_stock", `attempt ${ctx.attempt} fails`);
      return { reserved: true, attempt: ctx.attempt };
    }),
    workflow.sleep("cool-off", 60_000),
    workflow.wait("approval", "approved", 3_600_000),
    workflow.run("ship", (ctx: StepContext) => {
      const approved = ctx.result("approval");
      effect("ship");
      return { approved };
    }),
  ],
  retry: { attemptsMax: 3, firstBackoffMs: 1_000, backoffMaxMs: 10_000 },
};

const TEN: WorkflowDef = {
  name: "ten",
  steps: Array.from({ length: 10 }, (_, i) =>
    workflow.run(`s${i}`, () => {
      effect(`s${i}`);
      return null;
    }),
  ),
};

const TALLIED: WorkflowDef = {
  name: "tallied",
  steps: [
    workflow.call(
      "add",
      (ctx: StepContext) => {
        const input = ctx.input as { by: number; app: string; code?: string };
        return {
          to: { app: input.app, class: "tally", name: ctx.id },
          call: input.code === undefined ? "tally_api.add" : "tally_api.fail",
          args: input.code === undefined ? { by: input.by } : { code: input.code },
        };
      },
      30_000,
    ),
    workflow.run("record", (ctx: StepContext) => {
      const total = ctx.result("add");
      effect("record");
      return { total };
    }),
  ],
  retry: { attemptsMax: 2, firstBackoffMs: 1_000, backoffMaxMs: 1_000 },
};

const WORKFLOWS = [ORDER, TEN, TALLIED];

function param(req: Request, name: string): string {
  const v = req.queryParam(name);
  if (v === undefined) throw WasmkeepError.badRequest(`\`${name}\` is required`);
  return v;
}

export class Orders implements Actor {
  init(): void {
    sql.run("CREATE TABLE effects (step TEXT PRIMARY KEY, n INTEGER NOT NULL)");
  }

  request(req: Request): Response {
    switch (req.route) {
      case "POST /start":
        workflow.start(ORDER, param(req, "id"), { fail: req.queryInt("fail") ?? 0 });
        break;
      case "POST /start-ten":
        workflow.start(TEN, param(req, "id"));
        break;
      case "POST /start-tallied": {
        const code = req.queryParam("code");
        const input = { by: req.queryInt("by") ?? 1, app: req.queryParam("app") ?? id().app, ...(code === undefined ? {} : { code }) };
        workflow.start(TALLIED, param(req, "id"), input);
        break;
      }
      case "POST /signal":
        workflow.signal(WORKFLOWS, param(req, "id"), param(req, "event"), req.text());
        break;
      case "POST /pause":
        workflow.pause(param(req, "id"));
        break;
      case "POST /resume":
        workflow.resume(WORKFLOWS, param(req, "id"));
        break;
      case "POST /cancel":
        workflow.cancel(param(req, "id"));
        break;
      case "POST /restart":
        workflow.restartFrom(WORKFLOWS, param(req, "id"), param(req, "step"));
        break;
      case "GET /status": {
        const id = param(req, "id");
        const inst = workflow.get(id);
        if (inst === undefined) throw WasmkeepError.notFound(`no order \`${id}\``);
        const history = workflow.history(id).map((d) => ({ step: d.step, name: d.name, result: d.result, attempts: d.attempts, done_ms: d.doneMs }));
        return Response.json({ state: inst.state, step: inst.step, failures: inst.failures, wake_ms: inst.wakeMs, error: inst.error, history });
      }
      case "GET /effects": {
        const out: Record<string, number> = {};
        for (const r of sql.exec<{ step: string; n: number }>("SELECT step, n FROM effects ORDER BY step")) out[r.step] = r.n;
        return Response.json(out);
      }
      default:
        return Response.notFound();
    }
    return Response.status(204);
  }

  alarm(_info: AlarmInfo): void {
    workflow.onAlarm(WORKFLOWS);
  }

  message(msg: Message): Uint8Array {
    const r = workflow.onMessage(WORKFLOWS, msg);
    if (r === undefined) throw new WasmkeepError("no_handler", "orders take no other messages");
    return r;
  }

  response(r: OutboxResponse): void {
    workflow.onResponse(WORKFLOWS, r);
  }
}
