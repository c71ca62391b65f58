//! The examples app that `wasmkeep serve --examples` deploys as
//! `demo/examples`. Each module is one class; the benchmarks and the
//! acceptance checks rely on the routes documented in each.

mod counter;
mod notes;
mod reminder;
mod watch;

wasmkeep_sdk::app!(
    "counter" => counter::Counter,
    "notes" => notes::Notes,
    "reminder" => reminder::Reminder,
    "watch" => watch::Watch,
);
