//! The examples app that `wasmkeep serve --examples` deploys as
//! `demo/examples`. Each module is one class; the benchmarks and the
//! acceptance checks rely on the routes documented in each. `rings` and
//! `watch` are the second seed's two scenarios; `presence` is its
//! LivePresence object whole, on the outbox (issue 20); `pinger` is the
//! outbox's acceptance contract.

mod calls;
mod chat;
mod counter;
mod files;
mod notes;
mod orders;
mod pinger;
mod presence;
mod profiles;
mod reminder;
mod rings;
mod timers;
mod waiter;
mod watch;

wasmkeep_sdk::app!(
    "caller" => calls::Caller,
    "chat" => chat::Chat,
    "counter" => counter::Counter,
    "files" => files::Files,
    "notes" => notes::Notes,
    "orders" => orders::Orders,
    "pinger" => pinger::Pinger,
    "presence" => presence::Presence,
    "profiles" => profiles::Profiles,
    "reminder" => reminder::Reminder,
    "rings" => rings::Rings,
    "tally" => calls::Tally,
    "timers" => timers::Timers,
    "waiter" => waiter::Waiter,
    "watch" => watch::Watch,
);
