//! Typed calls between actors, on the outbox (issue 36; ADR 0051).
//!
//! [`interface!`](crate::interface) declares, once, the methods an actor
//! answers to other actors. It makes a module with:
//!
//! - `Api`, the trait the callee implements (each method takes its typed
//!   arguments and returns `Result<T>`);
//! - `serve(&mut actor, &msg)`, to call from
//!   [`Actor::message`](crate::Actor::message): it decodes the call, runs
//!   the method and encodes its answer;
//! - `Client`, the caller's stub: `Client::to(class, name).add(5, &ctx)`
//!   sends the call through the [outbox](crate::outbox) (after the event
//!   commits, effectively once) and returns the send's sequence number;
//! - `Reply`, the typed answer: in [`Actor::response`](crate::Actor::response),
//!   `Reply::of::<Ctx>(&r)` gives `Some((Reply::add(Ok(total)), ctx))` for
//!   an answer to this interface (`Err(error)` with the callee's code when
//!   its method failed, or the outbox's when the call could not be
//!   delivered), `None` for anything else.
//!
//! No turn waits: the answer arrives in an event of its own, with the
//! context the call attached, and the caller decides there from what its
//! database holds then.
//!
//! **Wire format**, shared with the TypeScript SDK (`calls` in
//! `@wasmkeep/sdk`), so either language calls the other: the body is JSON
//! `{"call":"<interface>.<method>","args":{"<name>":<value>,...}}`, the
//! answer the method's result as JSON. The context is
//! `wk-call:<interface>.<method>\n` followed by the caller's own context.
//!
//! **Versioning.** Arguments travel by name. A new argument must be an
//! `Option<T>`: a caller built before it omits it and the callee sees
//! `None`; a caller built after it, calling an older callee, has the
//! argument ignored. Renaming or removing an argument, or changing its
//! type, breaks older callers: their calls are refused with `bad_arguments`
//! (they get `Err` in their `Reply`), never applied with a wrong value. A
//! method a callee does not have is refused with `unknown_method`. A new
//! method is added without breaking anyone.
//!
//! ```no_run
//! use wasmkeep_sdk::{Actor, Request, Response, Result, outbox, sql};
//!
//! wasmkeep_sdk::interface! {
//!     /// What a counter answers to other actors.
//!     pub mod counter_api {
//!         fn add(by: i64) -> i64;
//!         fn get() -> i64;
//!     }
//! }
//!
//! #[derive(Default)]
//! struct Counter;
//!
//! impl counter_api::Api for Counter {
//!     fn add(&mut self, by: i64) -> Result<i64> {
//!         let rows = sql::query("UPDATE c SET n = n + ?1 RETURNING n", wasmkeep_sdk::params![by])?;
//!         Ok(rows.rows[0].int(0))
//!     }
//!     fn get(&mut self) -> Result<i64> {
//!         Ok(sql::query("SELECT n FROM c", &[])?.rows[0].int(0))
//!     }
//! }
//!
//! impl Actor for Counter {
//!     fn request(&mut self, _req: Request) -> Result<Response> {
//!         Ok(Response::not_found())
//!     }
//!     fn message(&mut self, msg: outbox::Message) -> Result<Vec<u8>> {
//!         counter_api::serve(self, &msg)
//!     }
//! }
//!
//! // A caller: sends, and hears back in its own event.
//! #[derive(Default)]
//! struct Caller;
//!
//! impl Actor for Caller {
//!     fn request(&mut self, _req: Request) -> Result<Response> {
//!         counter_api::Client::to("counter", "c1").add(5, &"note".to_string())?;
//!         Ok(Response::status(202))
//!     }
//!     fn response(&mut self, r: outbox::Response) -> Result<()> {
//!         match counter_api::Reply::of::<String>(&r) {
//!             Some((counter_api::Reply::add(Ok(total)), note)) => { /* total, note */ }
//!             Some((counter_api::Reply::add(Err(e)), _)) => { /* e.code */ }
//!             _ => {}
//!         }
//!         Ok(())
//!     }
//! }
//! ```

use crate::outbox::{Address, Answer, Context, Message, Response};
use crate::{Error, Result};

/// The context prefix that marks an answer to a typed call.
const TAG: &[u8] = b"wk-call:";

/// A typed call's body.
#[doc(hidden)]
pub fn __encode_call(call: &str, args: serde_json::Value) -> Vec<u8> {
    serde_json::json!({ "call": call, "args": args })
        .to_string()
        .into_bytes()
}

/// Sends a typed call to `to` with the caller's `context` (the stub's
/// methods call this).
#[doc(hidden)]
pub fn __send(
    to: &Address,
    call: &str,
    args: serde_json::Value,
    context: &impl Context,
) -> Result<u64> {
    let mut ctx = Vec::with_capacity(TAG.len() + call.len() + 1);
    ctx.extend_from_slice(TAG);
    ctx.extend_from_slice(call.as_bytes());
    ctx.push(b'\n');
    ctx.extend_from_slice(&context.encode());
    crate::outbox::send(to, &__encode_call(call, args), &ctx)
}

/// The method a message calls on `interface`, and its arguments; `None`
/// if the message is not a typed call of this interface.
#[doc(hidden)]
pub fn __decode_call(interface: &str, msg: &Message) -> Option<(String, serde_json::Value)> {
    let v: serde_json::Value = serde_json::from_slice(&msg.body).ok()?;
    let call = v.get("call")?.as_str()?;
    let (i, method) = call.split_once('.')?;
    (i == interface).then(|| {
        (
            method.to_owned(),
            v.get("args")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({})),
        )
    })
}

/// Whether `msg` is a typed call of `interface` (to route among several).
pub fn is_call_of(interface: &str, msg: &Message) -> bool {
    __decode_call(interface, msg).is_some()
}

/// The arguments of `method`, decoded, or `bad_arguments`.
#[doc(hidden)]
pub fn __args<T: serde::de::DeserializeOwned>(method: &str, args: serde_json::Value) -> Result<T> {
    serde_json::from_value(args).map_err(|e| {
        Error::new(
            "bad_arguments",
            format!("the arguments of `{method}` do not decode: {e}"),
        )
    })
}

/// A method's answer, encoded.
#[doc(hidden)]
pub fn __answer<T: serde::Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| Error::new("bad_answer", e.to_string()))
}

/// The refusal of a method the interface does not have.
#[doc(hidden)]
pub fn __unknown(interface: &str, method: &str) -> Error {
    Error::new(
        "unknown_method",
        format!(
            "`{interface}` has no method `{method}` here (the callee may be older than the caller)"
        ),
    )
}

/// An answer to a typed call, before its result is decoded.
#[doc(hidden)]
pub struct RawReply<'a> {
    /// The method called.
    pub method: &'a str,
    /// The answer's bytes, or the error.
    pub outcome: Result<&'a [u8]>,
    /// The caller's own context bytes.
    pub context: &'a [u8],
}

/// For an answer to a typed call of `interface`: the method, the raw
/// outcome, and the caller's own context bytes.
#[doc(hidden)]
pub fn __reply<'a>(interface: &str, r: &'a Response) -> Option<RawReply<'a>> {
    let rest = r.context_bytes().strip_prefix(TAG)?;
    let nl = rest.iter().position(|b| *b == b'\n')?;
    let call = std::str::from_utf8(&rest[..nl]).ok()?;
    let (i, method) = call.split_once('.')?;
    if i != interface {
        return None;
    }
    let outcome = match &r.answer {
        Answer::Reply(body) => Ok(body.as_slice()),
        Answer::Refused(e) | Answer::Failed(e) => Err(e.clone()),
        Answer::Http(_) => return None,
    };
    Some(RawReply {
        method,
        outcome,
        context: &rest[nl + 1..],
    })
}

/// Waits for a typed call's answer inside a handler (see
/// [`awaits`](crate::awaits)): the stubs' `wait()` methods call this.
#[doc(hidden)]
pub fn __wait<T: serde::de::DeserializeOwned>(
    to: &Address,
    call: &str,
    args: serde_json::Value,
    within_ms: u32,
) -> Result<T> {
    let body = crate::awaits::message_within(to, &__encode_call(call, args), within_ms)?;
    __result(Ok(&body))
}

/// A typed result from an answer's bytes.
#[doc(hidden)]
pub fn __result<T: serde::de::DeserializeOwned>(outcome: Result<&[u8]>) -> Result<T> {
    let body = outcome?;
    serde_json::from_slice(body).map_err(|e| {
        Error::new(
            "bad_answer",
            format!("the answer does not decode as the declared type: {e}"),
        )
    })
}

/// Declares the methods an actor answers to other actors: a module with
/// the callee's `Api` trait, its `serve` function, the caller's `Client`
/// and the typed `Reply` (see the [`calls`](crate::calls) module). Every
/// argument and result type is serde-serialisable.
#[macro_export]
macro_rules! interface {
    (
        $(#[$meta:meta])*
        $vis:vis mod $name:ident {
            $($(#[$mmeta:meta])* fn $method:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty ;)+
        }
    ) => {
        $(#[$meta])*
        #[allow(non_camel_case_types, dead_code)]
        $vis mod $name {
            use super::*;

            /// The interface's name on the wire.
            pub const NAME: &str = stringify!($name);

            /// What the callee implements.
            pub trait Api {
                $($(#[$mmeta])* fn $method(&mut self $(, $arg: $ty)*) -> $crate::Result<$ret>;)+
            }

            /// Runs the call `msg` carries on `actor` and encodes its
            /// answer; `unknown_method` for a method this interface does
            /// not have or a message that is not one of its calls.
            pub fn serve(actor: &mut impl Api, msg: &$crate::outbox::Message) -> $crate::Result<::std::vec::Vec<u8>> {
                let Some((method, args)) = $crate::calls::__decode_call(NAME, msg) else {
                    return Err($crate::calls::__unknown(NAME, "(not a call of this interface)"));
                };
                $(
                    if method == stringify!($method) {
                        #[derive($crate::serde::Deserialize)]
                        #[serde(crate = "wasmkeep_sdk::serde")]
                        struct Args { $($arg: $ty),* }
                        let _a: Args = $crate::calls::__args(&method, args)?;
                        let out = actor.$method($(_a.$arg),*)?;
                        return $crate::calls::__answer(&out);
                    }
                )+
                Err($crate::calls::__unknown(NAME, &method))
            }

            /// The caller's stub: each method sends its call.
            pub struct Client(pub $crate::outbox::Address);

            impl Client {
                /// The actor `class/name` of this app.
                pub fn to(class: &str, name: &str) -> Client {
                    Client($crate::outbox::to(class, name))
                }
                $(
                    /// Sends this call; its answer comes to `Actor::response`.
                    pub fn $method(&self $(, $arg: $ty)*, context: &impl $crate::outbox::Context) -> $crate::Result<u64> {
                        let args = $crate::serde_json::json!({ $(stringify!($arg): $arg),* });
                        $crate::calls::__send(&self.0, concat!(stringify!($name), ".", stringify!($method)), args, context)
                    }
                )+

                /// The same calls, each waiting for its typed answer inside
                /// the handler (`request` and `alarm` only; see
                /// `wasmkeep_sdk::awaits`), at most 30 s.
                pub fn wait(&self) -> Waiting<'_> {
                    Waiting { to: &self.0, within_ms: 0 }
                }
            }

            /// Calls that wait for their answer (`Client::wait`).
            pub struct Waiting<'a> {
                to: &'a $crate::outbox::Address,
                within_ms: u32,
            }

            impl Waiting<'_> {
                /// Waits at most `ms` (at most 300,000) instead of 30 s.
                pub fn within(mut self, ms: u32) -> Self {
                    self.within_ms = ms;
                    self
                }
                $(
                    /// Calls this method and waits for its answer.
                    pub fn $method(&self $(, $arg: $ty)*) -> $crate::Result<$ret> {
                        let args = $crate::serde_json::json!({ $(stringify!($arg): $arg),* });
                        $crate::calls::__wait(self.to, concat!(stringify!($name), ".", stringify!($method)), args, self.within_ms)
                    }
                )+
            }

            /// A typed answer.
            #[derive(Debug)]
            pub enum Reply {
                $($method($crate::Result<$ret>),)+
            }

            impl Reply {
                /// The typed answer and the caller's context, if `r`
                /// answers a call of this interface.
                pub fn of<C: $crate::outbox::Context>(r: &$crate::outbox::Response) -> Option<(Reply, C)> {
                    let raw = $crate::calls::__reply(NAME, r)?;
                    let ctx = C::decode(raw.context)?;
                    $(
                        if raw.method == stringify!($method) {
                            return Some((Reply::$method($crate::calls::__result(raw.outcome)), ctx));
                        }
                    )+
                    None
                }
            }
        }
    };
}
