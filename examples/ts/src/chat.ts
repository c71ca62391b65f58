// `chat`: a chat room over WebSockets with hibernation, as the Rust example.
//
// - `GET /ws?name=N` upgrades to a WebSocket in room `{name}` (the actor).
// - Every text message is delivered to every socket of the room, the
//   sender's included; a text starting with `!fail` is broadcast and then
//   the event fails, so nobody receives it.
// - `ping` is answered `pong` by the node itself, without waking the room.
// - `GET /count`: `{"sockets":N}`; `GET /who`: `{"names":[...]}`.

import { Actor, Request, Response, SocketInfo, SocketMessage, WasmkeepError, sockets } from "@wasmkeep/sdk";

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
}
