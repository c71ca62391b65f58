//! The serde JSON helpers of [`Request`] and [`Response`] (feature `json`).
//! Those of the key-value store are in [`kv`](crate::kv).

use crate::{Error, Request, Response, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

impl Request {
    /// The body parsed as JSON into a `T`.
    ///
    /// A body that is not a JSON `T` is [`Error::bad_request`], whose
    /// message is `request body is not the expected JSON: ` followed by
    /// serde_json's reason, which names the line and column (say,
    /// ``missing field `title` at line 1 column 15``). The `content-type`
    /// header is not checked.
    ///
    /// Passed on with `?`, that error fails the event: the client gets 400
    /// `bad_request` and everything the event wrote is rolled back (see
    /// [`Actor::request`](crate::Actor::request)). To answer 400 and keep
    /// the event's writes, match on it and return
    /// `Ok(Response::error(400, &e))` instead ([`Response::error`]).
    ///
    /// ```no_run
    /// use serde::Deserialize;
    /// use wasmkeep_sdk::{Actor, Request, Response, Result, params, sql};
    ///
    /// #[derive(Deserialize)]
    /// struct NewNote {
    ///     title: String,
    ///     #[serde(default)]
    ///     tags: Vec<String>,
    /// }
    ///
    /// #[derive(Default)]
    /// struct Notes;
    ///
    /// impl Actor for Notes {
    ///     fn request(&mut self, req: Request) -> Result<Response> {
    ///         match req.route() {
    ///             ("POST", "/notes") => {
    ///                 // A bad body: 400 bad_request, nothing written.
    ///                 let note: NewNote = req.json()?;
    ///                 let id = sql::insert(
    ///                     "INSERT INTO notes (title, tags) VALUES (?1, ?2)",
    ///                     params![note.title, note.tags.join(",")],
    ///                 )?;
    ///                 Response::json_value(201, &serde_json::json!({ "id": id }))
    ///             }
    ///             _ => Ok(Response::not_found()),
    ///         }
    ///     }
    /// }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body)
            .map_err(|e| Error::bad_request(format!("request body is not the expected JSON: {e}")))
    }
}

impl Response {
    /// A JSON response (`content-type: application/json`) whose body is
    /// `value` serialised with serde_json.
    ///
    /// Fails with code `invalid_value` only if `value` cannot be written as
    /// JSON (a map whose keys are not strings, or a `Serialize` impl that
    /// fails); returned from a request's handler, that is a 500. Unlike
    /// [`Response::json`], which sends text that already is JSON, this
    /// cannot produce a malformed body.
    ///
    /// ```no_run
    /// use serde::Serialize;
    /// use wasmkeep_sdk::{Response, Result};
    ///
    /// #[derive(Serialize)]
    /// struct Count {
    ///     value: i64,
    /// }
    ///
    /// fn answer(n: i64) -> Result<Response> {
    ///     Response::json_value(200, &Count { value: n })
    /// }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "json")))]
    pub fn json_value<T: Serialize + ?Sized>(status: u16, value: &T) -> Result<Response> {
        let body = serde_json::to_vec(value).map_err(|e| {
            Error::new(
                "invalid_value",
                format!("the response body could not be written as JSON: {e}"),
            )
        })?;
        Ok(Response {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
    struct Note {
        title: String,
    }

    fn request(body: &[u8]) -> Request {
        Request {
            method: "POST".into(),
            path: "/".into(),
            query: String::new(),
            headers: Vec::new(),
            body: body.to_vec(),
        }
    }

    #[test]
    fn a_body_parses_or_is_a_bad_request_naming_what_failed() {
        let ok: Note = request(br#"{"title":"plan"}"#).json().unwrap();
        assert_eq!(
            ok,
            Note {
                title: "plan".into()
            }
        );
        let e = request(br#"{"name":"plan"}"#).json::<Note>().unwrap_err();
        assert_eq!(e.code, "bad_request");
        assert!(e.message.contains("missing field `title`"), "{}", e.message);
        assert!(e.message.contains("line 1 column"), "{}", e.message);
        let e = request(b"").json::<Note>().unwrap_err();
        assert_eq!(e.code, "bad_request");
    }

    #[test]
    fn a_value_is_serialised_with_its_content_type() {
        let r = Response::json_value(
            201,
            &Note {
                title: "a\"b".into(),
            },
        )
        .unwrap();
        assert_eq!(r.status, 201);
        assert_eq!(r.headers[0].1, "application/json");
        assert_eq!(r.body, br#"{"title":"a\"b"}"#);
        let mut bad = BTreeMap::new();
        bad.insert((1, 2), 3);
        let e = Response::json_value(200, &bad).unwrap_err();
        assert_eq!(e.code, "invalid_value");
    }
}
