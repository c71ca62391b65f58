// The examples app in TypeScript, deployed by `wasmkeep serve --examples`
// as `demo/examples-ts` beside the Rust `demo/examples`: the same classes
// answer the same routes, so every workload and acceptance check runs
// against both languages.

import { app } from "@wasmkeep/sdk";
import { Caller, Tally } from "./calls";
import { Chat } from "./chat";
import { Counter } from "./counter";
import { Files } from "./files";
import { Orders } from "./orders";
import { Pinger } from "./pinger";
import { Profiles } from "./profiles";
import { Reminder } from "./reminder";
import { Timers } from "./timers";
import { Waiter } from "./waiter";

export default app({
  caller: Caller,
  chat: Chat,
  counter: Counter,
  files: Files,
  orders: Orders,
  pinger: Pinger,
  profiles: Profiles,
  reminder: Reminder,
  tally: Tally,
  timers: Timers,
  waiter: Waiter,
});
