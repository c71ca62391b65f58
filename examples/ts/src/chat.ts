// `chat`: a chat room over WebSockets with hibernation, as the Rust example.
//
// - `GET /ws?name=N` upgrades to a WebSocket in room `{name}` (the actor).
// - Every text message is delivered to every socket of the room, the
//   sender's included; a text starting with `!fail` is broadcast and then
//   the event fails, so nobody receives it.
// - `ping` is answered `pong` by the node itself, without waking the room.
// - `GET /count`: `{"sockets":N}`; `GET /who`: `{"names":[...]}`.
// - `GET /left`: `{"left":[{"name","code","failed","reason"},...]}`, every
//   socket that ended, in order: closed (`socketClose`) or failed without
//   a close (`socketError`, code 1006).

import { Actor, Request, Response, SocketInfo, SocketMessage, WasmkeepError, sockets, sql } from "@wasmkeep/sdk";

const decoder = new TextDecoder();

export class Chat implements Actor {
  request(req: Request): Response {
    switch (req.route) {
      case "GET /ws":
        sockets.accept(["room"], req.queryParam("name") ?? "");
        sockets.setAutoResponse(["ping", "pong"]);
        return Response.status(101);
      case "GET /count":
        return Response.json({ sockets: sockets.list().length });
      case "GET /who":
        return Response.json({ names: sockets.list().map((s) => decoder.decode(s.attachment)).sort() });
      case "GET /left": {
        departures();
        const rows = sql.exec<{ name: string; code: number; failed: number; reason: string }>(
          "SELECT name, code, failed, reason FROM departures ORDER BY seq",
        );
        return Response.json({ left: [...rows].map((r) => ({ ...r, failed: r.failed === 1 })) });
      }
      default:
        return Response.notFound();
    }
  }

  socketMessage(_socket: SocketInfo, message: SocketMessage): void {
    if (typeof message !== "string") return;
    sockets.broadcast("room", message);
    if (message.startsWith("!fail")) {
      throw new WasmkeepError("asked_to_fail", "failing after the broadcast, as asked");
    }
  }

  socketClose(socket: SocketInfo, code: number, reason: string): void {
    depart(socket, code, false, reason);
  }

  socketError(socket: SocketInfo, reason: string): void {
    depart(socket, sockets.ABNORMAL_CLOSURE, true, reason);
  }
}

// The room's record of sockets that ended (made at first use, so rooms
// older than it get one too).
function departures(): void {
  sql.run(
    "CREATE TABLE IF NOT EXISTS departures (seq INTEGER PRIMARY KEY, name TEXT NOT NULL, " +
      "code INTEGER NOT NULL, failed INTEGER NOT NULL, reason TEXT NOT NULL)",
  );
}

function depart(socket: SocketInfo, code: number, failed: boolean, reason: string): void {
  departures();
  sql.run(
    "INSERT INTO departures (name, code, failed, reason) VALUES (?1, ?2, ?3, ?4)",
    decoder.decode(socket.attachment),
    code,
    failed ? 1 : 0,
    reason,
  );
}
