//! The `response` interface: how an `on-request` handler gives the node its
//! response's headers and body (ADR 0033).
//!
//! These two imports are linked by hand rather than through the generated
//! bindings: their parameters arrive as `WasmStr` and `WasmList<u8>`,
//! views of the guest's memory, so a header or a chunk of body is measured
//! against its limit before a byte of it is copied to the host. A result
//! of `on-request` cannot be read that way (wasmtime frees it in the guest,
//! post-return, before the host sees it), which is why 0.2 of the world
//! moved both out of the result.

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, WasmList, WasmStr};

use crate::error::RuntimeError;
use crate::host::{HostState, WitError};

/// What an actor answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActorResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The request's event accepted a WebSocket upgrade (ADR 0043): the
    /// socket's id, registered in the node's table once the event was
    /// durable; the edge completes the upgrade.
    pub socket: Option<u64>,
}

/// The interface's name in the component model.
const INTERFACE: &str = "wasmkeep:actor/response@0.2.0";

/// Most headers one response may carry.
pub(crate) const RESPONSE_HEADERS_MAX: usize = 256;
/// Most bytes of header names and values one response may carry.
pub(crate) const RESPONSE_HEADER_BYTES_MAX: usize = 256 * 1024;

/// A response's headers, in the order the guest added them.
pub(crate) type Headers = Vec<(String, String)>;

/// The response the running `on-request` call is building.
#[derive(Debug, Default)]
pub struct ResponseParts {
    /// Whether an `on-request` call is running (outside one, both imports
    /// fail with `no_request`).
    active: bool,
    /// `response_body_bytes_max` for this call.
    body_bytes_max: usize,
    pub headers: Headers,
    header_bytes: usize,
    pub body: Vec<u8>,
    /// The first limit the guest ran into: the event fails with it even if
    /// the guest ignored the error it got.
    refused: Option<RuntimeError>,
}

impl ResponseParts {
    /// Opens a response for one `on-request` call.
    pub fn start(&mut self, body_bytes_max: usize) {
        *self = ResponseParts {
            active: true,
            body_bytes_max,
            ..ResponseParts::default()
        };
    }

    /// Closes the response: its parts, or the limit the guest ran into.
    /// Whether a request is being handled (between `start` and `finish`).
    pub fn is_open(&self) -> bool {
        self.active
    }

    pub fn finish(&mut self) -> Result<(Headers, Vec<u8>), RuntimeError> {
        let parts = std::mem::take(self);
        match parts.refused {
            Some(e) => Err(e),
            None => Ok((parts.headers, parts.body)),
        }
    }

    fn refuse(&mut self, e: RuntimeError) -> WitError {
        let err = WitError {
            code: e.code(),
            message: e.to_string(),
        };
        self.refused.get_or_insert(e);
        err
    }

    fn no_request() -> WitError {
        WitError {
            code: "no_request".into(),
            message: "there is no response to build outside on-request".into(),
        }
    }

    /// Why a header of `bytes` more does not fit, if it does not: the
    /// guest's error, and the event's (none outside `on-request`).
    fn header_refusal(&self, bytes: usize) -> Option<(WitError, Option<RuntimeError>)> {
        if !self.active {
            return Some((Self::no_request(), None));
        }
        let count = self.headers.len() + 1;
        let total = self.header_bytes.saturating_add(bytes);
        (count > RESPONSE_HEADERS_MAX || total > RESPONSE_HEADER_BYTES_MAX).then(|| {
            let e = RuntimeError::ResponseHeadersTooLarge {
                count,
                bytes: total,
            };
            let guest = WitError {
                code: e.code(),
                message: e.to_string(),
            };
            (guest, Some(e))
        })
    }

    /// Records what [`Self::header_refusal`] found; the guest's error.
    fn refuse_header(&mut self, (guest, event): (WitError, Option<RuntimeError>)) -> WitError {
        if let Some(e) = event {
            self.refused.get_or_insert(e);
        }
        guest
    }

    /// Whether a chunk of `bytes` more fits in the body; refuses it
    /// otherwise.
    fn admit_body(&mut self, bytes: usize) -> Result<(), WitError> {
        if !self.active {
            return Err(Self::no_request());
        }
        let size = self.body.len().saturating_add(bytes);
        if size > self.body_bytes_max {
            return Err(self.refuse(RuntimeError::ResponseTooLarge {
                size,
                limit: self.body_bytes_max,
            }));
        }
        Ok(())
    }
}

/// Links `add-header` and `write-body`.
/// Checks a whole set of headers against the same bounds (a parked
/// reply's, completed in one call).
pub(crate) fn check_headers(headers: &[(String, String)]) -> Result<(), WitError> {
    let bytes: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    if headers.len() > RESPONSE_HEADERS_MAX || bytes > RESPONSE_HEADER_BYTES_MAX {
        let e = RuntimeError::ResponseHeadersTooLarge {
            count: headers.len(),
            bytes,
        };
        return Err(WitError {
            code: e.code(),
            message: e.to_string(),
        });
    }
    Ok(())
}

pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    let mut i = linker.instance(INTERFACE)?;
    i.func_wrap(
        "add-header",
        |mut store: StoreContextMut<'_, HostState>, (name, value): (WasmStr, WasmStr)| {
            // For UTF-8 these borrow the guest's memory: nothing is copied
            // before the sizes are checked.
            let (n, v) = (name.to_str(&store)?, value.to_str(&store)?);
            let bytes = n.len().saturating_add(v.len());
            if let Some(refusal) = store.data().response.header_refusal(bytes) {
                return Ok((Err(store.data_mut().response.refuse_header(refusal)),));
            }
            let header = (n.into_owned(), v.into_owned());
            let parts = &mut store.data_mut().response;
            parts.header_bytes += bytes;
            parts.headers.push(header);
            Ok((Ok(()),))
        },
    )?;
    i.func_wrap(
        "write-body",
        |mut store: StoreContextMut<'_, HostState>, (chunk,): (WasmList<u8>,)| {
            let admitted = store.data_mut().response.admit_body(chunk.len());
            if let Err(e) = admitted {
                return Ok((Err(e),));
            }
            let mut body = std::mem::take(&mut store.data_mut().response.body);
            body.extend_from_slice(chunk.as_le_slice(&store));
            store.data_mut().response.body = body;
            Ok((Ok(()),))
        },
    )?;
    Ok(())
}
