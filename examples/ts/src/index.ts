// The examples app in TypeScript, deployed by `wasmkeep serve --examples`
// as `demo/examples-ts` beside the Rust `demo/examples`: the same classes
// answer the same routes, so every workload and acceptance check runs
// against both languages.

import { app } from "@wasmkeep/sdk";
import { Chat } from "./chat";
import { Counter } from "./counter";
import { Pinger } from "./pinger";
import { Reminder } from "./reminder";

export default app({
  chat: Chat,
  counter: Counter,
  pinger: Pinger,
  reminder: Reminder,
});
