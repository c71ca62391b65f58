//! The app's configuration (ADR 0041): the variables of its manifest's
//! `[vars]`, and the secrets an operator set (`wasmkeep secret set
//! TENANT/APP NAME`, the value on stdin).
//!
//! A secret's value never appears in the node's logs, inspect output or
//! metrics: a line this actor logs that holds one has it replaced by
//! `[secret]`.
//!
//! ```no_run
//! use wasmkeep_sdk::{Error, Result, config};
//!
//! fn api_key() -> Result<String> {
//!     config::get("API_KEY").ok_or_else(|| Error::new("not_configured", "set the secret API_KEY"))
//! }
//! ```

use crate::wit;

/// The secret named `name` if there is one, else the variable of that
/// name, else `None`. Read it where you use it: a secret set while the
/// actor is active is seen by its next call.
pub fn get(name: &str) -> Option<String> {
    wit::config::get(name)
}
