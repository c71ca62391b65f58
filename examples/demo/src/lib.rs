//! The examples app that `wasmkeep serve --examples` deploys as
//! `demo/examples`. Each module is one class; the benchmarks and the
//! acceptance checks rely on the routes documented in each. `rings` and
//! `watch` are the second seed's two scenarios; `presence` is its
//! LivePresence object whole, on the outbox (issue 20); `pinger` is the
//! outbox's acceptance contract.

mod chat;
mod counter;
mod notes;
mod pinger;
mod presence;
mod reminder;
mod rings;
mod timers;
mod watch;

wasmkeep_sdk::app!(
    "chat" => chat::Chat,
    "counter" => counter::Counter,
    "notes" => notes::Notes,
    "pinger" => pinger::Pinger,
    "presence" => presence::Presence,
    "reminder" => reminder::Reminder,
    "rings" => rings::Rings,
    "timers" => timers::Timers,
    "watch" => watch::Watch,
);
