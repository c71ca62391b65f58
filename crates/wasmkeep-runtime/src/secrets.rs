//! Apps' secrets as the node's users see them (ADR 0041):
//! [`Runtime::secrets`] hands out a [`Secrets`] handle to set, remove and
//! list them. Their values reach only the app's instances (`config.get`,
//! `app_config.rs`), never a listing.

use crate::error::RuntimeError;
use crate::runtime::Runtime;

impl Runtime {
    /// Apps' secrets on this node.
    pub fn secrets(&self) -> Secrets<'_> {
        Secrets { rt: self }
    }
}

/// Apps' secrets on this node: see [`Runtime::secrets`].
pub struct Secrets<'a> {
    rt: &'a Runtime,
}

impl Secrets<'_> {
    /// Sets (or replaces) one of an app's secrets; the app's actors read
    /// the new value from their next `config.get`.
    pub fn set(
        &self,
        tenant: &str,
        app: &str,
        name: &str,
        value: &str,
    ) -> Result<(), RuntimeError> {
        self.rt.inner.secrets.set(tenant, app, name, value)
    }

    /// Removes one of an app's secrets; whether it existed.
    pub fn delete(&self, tenant: &str, app: &str, name: &str) -> Result<bool, RuntimeError> {
        self.rt.inner.secrets.delete(tenant, app, name)
    }

    /// The names (never the values) of an app's secrets.
    pub fn names(&self, tenant: &str, app: &str) -> Result<Vec<String>, RuntimeError> {
        self.rt.inner.secrets.names(tenant, app)
    }
}
