//! `files`: values larger than a row (`wasmkeep_sdk::blobs`), stored in
//! chunks, uploaded in parts and served a chunk at a time.
//!
//! - `PUT /blob?name=N` with the bytes as body: `{"size":S}` (replaces).
//! - `POST /blob/append?name=N` with the next part as body: `{"size":S}`.
//! - `GET /blob?name=N`: the bytes (`application/octet-stream`);
//!   with `&offset=O&len=L`, that range. 404 `not_found` if none.
//! - `GET /blob/size?name=N`: `{"size":S|null}`.
//! - `DELETE /blob?name=N`: `{"deleted":bool}`.
//! - `GET /blobs?prefix=P`: `{"blobs":[{"name","size"}]}` by name.
//!
//! And the rest of the actor's storage, whole:
//! - `PUT /kv?key=K` with the value as body; `GET /kv?prefix=P`:
//!   `{"keys":[…]}`; `DELETE /kv?prefix=P`: `{"deleted":N}`
//!   (`kv::delete_prefix`); `DELETE /kv/all`: `{"deleted":N}`.
//! - `POST /tables`: makes `parent` and `child` (a foreign key to
//!   `parent`), a row in each and the view `children`; `GET /tables`:
//!   `{"tables":[…],"views":[…]}`, the actor's own, by name.
//! - `POST /alarm?at=MS`; `GET /alarm`: `{"at":MS|null}`.
//! - `GET /size`: `{"bytes":B}` (`sql::database_size`).
//! - `POST /wipe`: `wasmkeep_sdk::delete_all`, then `{"bytes":B}`.
//! - `POST /id`: `{"id":"…"}` (`wasmkeep_sdk::unique_id`).

use serde_json::json;
use wasmkeep_sdk::{Actor, Error, Request, Response, Result, alarm, blobs, kv, params, sql};

#[derive(Default)]
pub struct Files;

fn name_of(req: &Request) -> Result<String> {
    req.query_param("name")
        .ok_or_else(|| Error::bad_request("`name` is required"))
}

fn octets(status: u16) -> Response {
    let mut r = Response::status(status);
    r.headers
        .push(("content-type".into(), "application/octet-stream".into()));
    r
}

impl Actor for Files {
    fn request(&mut self, req: Request) -> Result<Response> {
        let body = match req.route() {
            ("PUT", "/blob") => {
                let name = name_of(&req)?;
                blobs::put(&name, &req.body)?;
                json!({ "size": blobs::size(&name)? })
            }
            ("POST", "/blob/append") => json!({ "size": blobs::append(&name_of(&req)?, &req.body)? }),
            ("GET", "/blob") => {
                let name = name_of(&req)?;
                let mut r = octets(200);
                match req.query_u64("offset")? {
                    Some(offset) => {
                        let len = req.query_u64("len")?.unwrap_or(u64::MAX);
                        let len = usize::try_from(len).unwrap_or(usize::MAX);
                        r.body = blobs::read(&name, offset, len)?;
                    }
                    None => {
                        blobs::write_response_body(&name)?;
                    }
                }
                return Ok(r);
            }
            ("GET", "/blob/size") => json!({ "size": blobs::size(&name_of(&req)?)? }),
            ("DELETE", "/blob") => json!({ "deleted": blobs::delete(&name_of(&req)?)? }),
            ("GET", "/blobs") => {
                let prefix = req.query_param("prefix").unwrap_or_default();
                let list: Vec<_> = blobs::list(&prefix)?
                    .into_iter()
                    .map(|(name, size)| json!({ "name": name, "size": size }))
                    .collect();
                json!({ "blobs": list })
            }
            _ => match storage(&req)? {
                Some(body) => body,
                None => return Ok(Response::not_found()),
            },
        };
        Ok(Response::json(200, body.to_string()))
    }
}

/// The routes over the actor's storage as a whole; `None` for any other.
fn storage(req: &Request) -> Result<Option<serde_json::Value>> {
    let prefix = || req.query_param("prefix").unwrap_or_default();
    Ok(Some(match req.route() {
        ("PUT", "/kv") => {
            let key = req
                .query_param("key")
                .ok_or_else(|| Error::bad_request("`key` is required"))?;
            kv::put(&key, &req.body)?;
            json!({})
        }
        ("GET", "/kv") => {
            let keys: Vec<String> = kv::list_prefix(&prefix(), None)?
                .into_iter()
                .map(|(k, _)| k)
                .collect();
            json!({ "keys": keys })
        }
        ("DELETE", "/kv") => json!({ "deleted": kv::delete_prefix(&prefix())? }),
        ("DELETE", "/kv/all") => json!({ "deleted": kv::delete_all()? }),
        ("POST", "/tables") => {
            for statement in [
                "CREATE TABLE IF NOT EXISTS parent (id INTEGER PRIMARY KEY)",
                "CREATE TABLE IF NOT EXISTS child (id INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent(id))",
                "CREATE VIEW IF NOT EXISTS children AS SELECT child.id FROM child JOIN parent ON parent.id = child.parent_id",
                "INSERT OR IGNORE INTO parent (id) VALUES (1)",
                "INSERT OR IGNORE INTO child (id, parent_id) VALUES (1, 1)",
            ] {
                sql::execute(statement, &[])?;
            }
            json!({})
        }
        ("GET", "/tables") => {
            let names = |kind: &str| -> Result<Vec<String>> {
                Ok(sql::query(
                    "SELECT name FROM sqlite_schema WHERE type = ?1 AND name NOT LIKE '\\_wasmkeep\\_%' ESCAPE '\\' ORDER BY name",
                    params![kind],
                )?
                .rows
                .iter()
                .map(|r| r.text(0).to_owned())
                .collect())
            };
            json!({ "tables": names("table")?, "views": names("view")? })
        }
        ("POST", "/alarm") => {
            let at = req
                .query_u64("at")?
                .ok_or_else(|| Error::bad_request("`at` is required"))?;
            alarm::set(at)?;
            json!({})
        }
        ("GET", "/alarm") => json!({ "at": alarm::get() }),
        ("GET", "/size") => json!({ "bytes": sql::database_size() }),
        ("POST", "/wipe") => {
            wasmkeep_sdk::delete_all()?;
            json!({ "bytes": sql::database_size() })
        }
        ("POST", "/id") => json!({ "id": wasmkeep_sdk::unique_id()? }),
        _ => return Ok(None),
    }))
}
