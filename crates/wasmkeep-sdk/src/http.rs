//! [`Request`] and [`Response`], re-exported at the crate's root.

use crate::{Error, Result};

/// An HTTP request addressed to one actor, as [`Actor::request`](crate::Actor::request)
/// gets it.
///
/// The node reads the body whole before the event (at most
/// `request_body_bytes_max`, 32 MiB by default; a larger one is refused
/// with 413 `body_too_large` before the actor sees it).
///
/// ```no_run
/// use wasmkeep_sdk::{Actor, Error, Request, Response, Result};
///
/// #[derive(Default)]
/// struct Echo;
///
/// impl Actor for Echo {
///     fn request(&mut self, req: Request) -> Result<Response> {
///         match req.route() {
///             ("POST", "/echo") => {
///                 let times = req.query_u64("times")?.unwrap_or(1);
///                 if times > 10 {
///                     return Err(Error::bad_request("at most 10 times"));
///                 }
///                 let lang = req.header("accept-language").unwrap_or("en");
///                 let text = req.text()?.repeat(times as usize);
///                 Ok(Response::text(200, format!("{lang}: {text}")))
///             }
///             _ => Ok(Response::not_found()),
///         }
///     }
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Request {
    /// The method, upper-case: `GET`, `POST`, ...
    pub method: String,
    /// The path after `/v1/{tenant}/{app}/{class}/{name}`, starting with `/`.
    pub path: String,
    /// The raw query string, without `?`; empty if none. See
    /// [`query_param`](Request::query_param).
    pub query: String,
    /// The request's headers, `(name, value)`, in order; see
    /// [`header`](Request::header).
    pub headers: Vec<(String, String)>,
    /// The body's bytes; see [`text`](Request::text) and, with the `json`
    /// feature, `json`.
    pub body: Vec<u8>,
}

impl Request {
    /// The first value of the query parameter `name`, percent-decoded (`+`
    /// is a space; bytes that do not decode to UTF-8 become U+FFFD);
    /// `None` if it is absent, `Some("")` for `?name` or `?name=`.
    ///
    /// ```no_run
    /// # fn f(req: wasmkeep_sdk::Request) {
    /// // GET /search?q=hello%20world
    /// let q = req.query_param("q").unwrap_or_default(); // "hello world"
    /// # let _ = q; }
    /// ```
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k) == name).then(|| percent_decode(v))
        })
    }

    /// The query parameter `name` as a `u64`: `Ok(None)` if it is absent,
    /// and [`Error::bad_request`] (so 400 from a request's handler) naming
    /// the parameter if it is not a number.
    ///
    /// ```no_run
    /// # fn f(req: wasmkeep_sdk::Request) -> wasmkeep_sdk::Result<()> {
    /// let limit = req.query_u64("limit")?.unwrap_or(100);
    /// # let _ = limit; Ok(()) }
    /// ```
    pub fn query_u64(&self, name: &str) -> Result<Option<u64>> {
        match self.query_param(name) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| {
                Error::bad_request(format!("query parameter `{name}` is not a number: `{v}`"))
            }),
        }
    }

    /// The first value of the header `name` (names compare
    /// case-insensitively); `None` if the request has none.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as UTF-8 text, or [`Error::bad_request`] (`body is not
    /// utf-8`) if it is not.
    pub fn text(&self) -> Result<&str> {
        std::str::from_utf8(&self.body).map_err(|_| Error::bad_request("body is not utf-8"))
    }

    /// `(method, path)`, to match routes on.
    ///
    /// ```no_run
    /// # use wasmkeep_sdk::{Request, Response, Result};
    /// # fn handle(req: Request) -> Result<Response> {
    /// match req.route() {
    ///     ("GET", "/value") => Ok(Response::json(200, r#"{"value":1}"#)),
    ///     ("POST", p) if p.starts_with("/items/") => Ok(Response::status(204)),
    ///     _ => Ok(Response::not_found()),
    /// }
    /// # }
    /// ```
    pub fn route(&self) -> (&str, &str) {
        (self.method.as_str(), self.path.as_str())
    }
}

/// A query string's key or value decoded as a form's: `+` is a space, `%`
/// and two hex digits a byte (`%2B` is `+`), a `%` that starts no escape
/// stays as it is, and bytes that are not UTF-8 become U+FFFD. `+` is
/// replaced first: it is not a hex digit, so it is never part of an escape.
fn percent_decode(s: &str) -> String {
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8_lossy()
        .into_owned()
}

/// What a request's handler answers: a status, headers and a body.
///
/// The node takes the headers and the body through host calls that check
/// their size first: at most 256 headers and 256 KiB of them, and a body
/// of at most `response_body_bytes_max` (32 MiB by default); past either,
/// the event fails with `response_too_large`. A status that is not a valid
/// HTTP status, or a 1xx one, is refused by the node after the event
/// committed (its writes stand): the client gets 500 `invalid_response`.
///
/// ```no_run
/// use wasmkeep_sdk::Response;
///
/// let mut r = Response::text(200, "hello");
/// r.headers.push(("cache-control".into(), "no-store".into()));
/// ```
#[derive(Debug, Clone)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The headers, `(name, value)`, in order.
    pub headers: Vec<(String, String)>,
    /// The body's bytes.
    pub body: Vec<u8>,
}

impl Response {
    /// A response with a status, no headers and no body:
    /// `Response::status(204)`.
    pub fn status(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A JSON response (`content-type: application/json`); `body` must
    /// already be JSON text: it is sent as it is. With the `json` feature,
    /// `Response::json_value` serialises a value instead.
    ///
    /// ```no_run
    /// # let n = 2;
    /// let r = wasmkeep_sdk::Response::json(200, format!("{{\"value\":{n}}}"));
    /// ```
    pub fn json(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into().into_bytes(),
        }
    }

    /// A plain-text response (`content-type: text/plain; charset=utf-8`).
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
            body: body.into().into_bytes(),
        }
    }

    /// The conventional 404 for a path the actor does not serve: the
    /// node's own body for it, code `route_not_found`.
    pub fn not_found() -> Response {
        Response::json(
            404,
            r#"{"error":{"code":"route_not_found","message":"no such route"}}"#,
        )
    }

    /// An error answered with `status`, in the body the node gives its own
    /// errors: `{"error":{"code":...,"message":...}}` (JSON).
    ///
    /// Returning `Err(error)` from a request's handler rolls the event's
    /// writes back (and only `bad_request`, `not_found` and `conflict` get
    /// a 4xx status). Returning `Ok(Response::error(..))` instead answers
    /// the client's mistake with any status and commits what the event
    /// wrote.
    ///
    /// ```no_run
    /// use wasmkeep_sdk::{Error, Request, Response, Result, kv};
    ///
    /// fn put_setting(req: &Request) -> Result<Response> {
    ///     kv::put("stats/attempts", b"1")?; // kept, even for a bad body
    ///     match req.text() {
    ///         Ok(v) if !v.is_empty() => {
    ///             kv::put("setting", v.as_bytes())?;
    ///             Ok(Response::status(204))
    ///         }
    ///         Ok(_) => Ok(Response::error(422, &Error::new("empty_value", "the body is empty"))),
    ///         Err(e) => Ok(Response::error(400, &e)),
    ///     }
    /// }
    /// ```
    pub fn error(status: u16, error: &Error) -> Response {
        let mut body = String::with_capacity(40 + error.code.len() + error.message.len());
        body.push_str("{\"error\":{\"code\":");
        push_json_string(&mut body, &error.code);
        body.push_str(",\"message\":");
        push_json_string(&mut body, &error.message);
        body.push_str("}}");
        Response::json(status, body)
    }
}

/// Appends `s` to `out` as a JSON string, quoted and escaped.
fn push_json_string(out: &mut String, s: &str) {
    use std::fmt::Write;
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(query: &str) -> Request {
        Request {
            method: "GET".into(),
            path: "/".into(),
            query: query.into(),
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: b"caf\xc3\xa9".to_vec(),
        }
    }

    #[test]
    fn query_parameters_decode_and_numbers_are_checked() {
        let r = request("q=hello%20world&x=a+b&flag&n=12&bad=1x");
        assert_eq!(r.query_param("q").as_deref(), Some("hello world"));
        assert_eq!(r.query_param("x").as_deref(), Some("a b"));
        assert_eq!(r.query_param("flag").as_deref(), Some(""));
        assert_eq!(r.query_param("missing"), None);
        assert_eq!(r.query_u64("n").unwrap(), Some(12));
        assert_eq!(r.query_u64("missing").unwrap(), None);
        assert_eq!(r.query_u64("bad").unwrap_err().code, "bad_request");
        assert_eq!(r.header("content-type"), Some("text/plain"));
        assert_eq!(r.text().unwrap(), "café");
    }

    #[test]
    fn query_parameters_decode_as_forms_do() {
        let r =
            request("s=a%20b&slash=%2F&pct=100%25&lone=5%&e=caf%C3%A9&safe=a-_.~z&p=%2B+&u=%FF");
        assert_eq!(r.query_param("s").as_deref(), Some("a b"));
        assert_eq!(r.query_param("slash").as_deref(), Some("/"));
        assert_eq!(r.query_param("pct").as_deref(), Some("100%"));
        assert_eq!(r.query_param("lone").as_deref(), Some("5%"));
        assert_eq!(r.query_param("e").as_deref(), Some("café"));
        assert_eq!(r.query_param("safe").as_deref(), Some("a-_.~z"));
        assert_eq!(r.query_param("p").as_deref(), Some("+ "));
        assert_eq!(r.query_param("u").as_deref(), Some("\u{FFFD}"));
        assert_eq!(
            request("a%2Bb=1&a+b=2").query_param("a b").as_deref(),
            Some("2")
        );
    }

    #[test]
    fn an_error_response_is_the_nodes_json_shape() {
        let e = Error::new("bad_request", "a \"quote\", a \\ and a\nline\u{1}");
        let r = Response::error(400, &e);
        assert_eq!(r.status, 400);
        assert_eq!(
            r.headers,
            vec![("content-type".to_string(), "application/json".to_string())]
        );
        assert_eq!(
            String::from_utf8(r.body).unwrap(),
            r#"{"error":{"code":"bad_request","message":"a \"quote\", a \\ and a\nline\u0001"}}"#
        );
    }
}
