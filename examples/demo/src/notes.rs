//! `notes`: a small document store using SQL tables and the key-value API.
//!
//! - `POST /notes?title=T` with the note's text as body: `{"id":N}`.
//! - `GET /notes`: every note, newest first, with its tags.
//! - `GET /notes/{id}`, `DELETE /notes/{id}`.
//! - `POST /notes/{id}/tags/{tag}`: tag a note (a row in `tags`).
//! - `PUT /settings/{key}` (body: value), `GET /settings/{key}`,
//!   `GET /settings`: per-document settings in the key-value store.

use serde_json::{Value as Json, json};
use wasmkeep_sdk::{Actor, Error, Request, Response, Result, kv, now_ms, params, sql};

#[derive(Default)]
pub struct Notes;

impl Actor for Notes {
    fn init(&mut self) -> Result<()> {
        sql::execute(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL, created_ms INTEGER NOT NULL)",
            &[],
        )?;
        sql::execute(
            "CREATE TABLE tags (note_id INTEGER NOT NULL REFERENCES notes(id) ON DELETE CASCADE, tag TEXT NOT NULL, PRIMARY KEY (note_id, tag))",
            &[],
        )?;
        Ok(())
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        match (req.method.as_str(), parts.as_slice()) {
            ("POST", ["notes"]) => {
                let title = req.query_param("title").unwrap_or_default();
                let id = sql::insert(
                    "INSERT INTO notes (title, body, created_ms) VALUES (?1, ?2, ?3)",
                    params![title, req.text()?, now_ms()],
                )?;
                Ok(Response::json(201, json!({ "id": id }).to_string()))
            }
            ("GET", ["notes"]) => {
                let rows = sql::query(
                    "SELECT n.id, n.title, n.body, n.created_ms, group_concat(t.tag) FROM notes n LEFT JOIN tags t ON t.note_id = n.id GROUP BY n.id ORDER BY n.id DESC",
                    &[],
                )?;
                let notes: Vec<Json> = rows.rows.iter().map(note_json).collect();
                Ok(Response::json(200, json!({ "notes": notes }).to_string()))
            }
            ("GET", ["notes", id]) => {
                let rows = sql::query(
                    "SELECT n.id, n.title, n.body, n.created_ms, group_concat(t.tag) FROM notes n LEFT JOIN tags t ON t.note_id = n.id WHERE n.id = ?1 GROUP BY n.id",
                    params![parse_id(id)?],
                )?;
                match rows.rows.first() {
                    Some(r) => Ok(Response::json(200, note_json(r).to_string())),
                    None => Ok(Response::not_found()),
                }
            }
            ("DELETE", ["notes", id]) => {
                let n = sql::execute("DELETE FROM notes WHERE id = ?1", params![parse_id(id)?])?;
                Ok(Response::status(if n > 0 { 204 } else { 404 }))
            }
            ("POST", ["notes", id, "tags", tag]) => {
                sql::execute(
                    "INSERT OR IGNORE INTO tags (note_id, tag) VALUES (?1, ?2)",
                    params![parse_id(id)?, *tag],
                )?;
                Ok(Response::status(204))
            }
            ("PUT", ["settings", key]) => {
                kv::put(&format!("setting/{key}"), &req.body)?;
                Ok(Response::status(204))
            }
            ("GET", ["settings", key]) => match kv::get(&format!("setting/{key}"))? {
                Some(v) => Ok(Response::text(200, String::from_utf8_lossy(&v))),
                None => Ok(Response::not_found()),
            },
            ("GET", ["settings"]) => {
                let all = kv::list_prefix("setting/", None)?;
                let map: serde_json::Map<String, Json> = all
                    .into_iter()
                    .map(|(k, v)| {
                        let k = k.trim_start_matches("setting/").to_owned();
                        (k, Json::String(String::from_utf8_lossy(&v).into_owned()))
                    })
                    .collect();
                Ok(Response::json(200, Json::Object(map).to_string()))
            }
            _ => Ok(Response::not_found()),
        }
    }
}

fn parse_id(s: &str) -> Result<i64> {
    s.parse()
        .map_err(|_| Error::bad_request(format!("not a note id: `{s}`")))
}

fn note_json(r: &sql::Row) -> Json {
    let tags: Vec<&str> = if r.is_null(4) {
        Vec::new()
    } else {
        r.text(4).split(',').collect()
    };
    json!({
        "id": r.int(0),
        "title": r.text(1),
        "body": r.text(2),
        "created_ms": r.int(3),
        "tags": tags,
    })
}
