//! `profiles`: schema migrations (issue 38; the SDK's `schema` module).
//! The class's migrations create its table, then add a column; the
//! manifest's `PROFILE_SCHEMA` variable picks how many of them a deploy
//! declares (`1`: the first; unset or `2`: both; `bad`: both and a third
//! that fails), so that one build plays successive deploys in the tests
//! and the README's walkthrough. A real class lists its migrations as a
//! constant and only ever appends to it.
//!
//! - `PUT /?name=N[&email=E]` stores the profile (`email` from schema 2 on).
//! - `GET /`: `{"name":N|null,"email":E|null,"schema":V}`, V the number of
//!   migrations the actor's database has had.

use serde_json::json;
use wasmkeep_sdk::{Actor, Error, Request, Response, Result, Value, config, schema, sql};

const MIGRATIONS: &[&str] = &[
    "CREATE TABLE profile (id INTEGER PRIMARY KEY CHECK (id = 0), name TEXT NOT NULL)",
    "ALTER TABLE profile ADD COLUMN email TEXT",
    "ALTER TABLE no_such_table ADD COLUMN broken TEXT",
];

#[derive(Default)]
pub struct Profiles;

impl Actor for Profiles {
    fn migrations() -> &'static [&'static str] {
        match config::get("PROFILE_SCHEMA").as_deref() {
            Some("1") => &MIGRATIONS[..1],
            Some("bad") => MIGRATIONS,
            _ => &MIGRATIONS[..2],
        }
    }

    fn request(&mut self, req: Request) -> Result<Response> {
        let schema = schema::version()?;
        match req.route() {
            ("PUT", "/") => {
                let name = req
                    .query_param("name")
                    .ok_or_else(|| Error::bad_request("`name` is required"))?;
                let email = req.query_param("email");
                if schema < 2 && email.is_some() {
                    return Err(Error::bad_request("`email` needs schema version 2"));
                }
                sql::execute(
                    "INSERT INTO profile (id, name) VALUES (0, ?1) ON CONFLICT (id) DO UPDATE SET name = excluded.name",
                    &[Value::Text(name)],
                )?;
                if let Some(e) = email {
                    sql::execute("UPDATE profile SET email = ?1 WHERE id = 0", &[Value::Text(e)])?;
                }
                Ok(Response::status(204))
            }
            ("GET", "/") => {
                let select = if schema < 2 {
                    "SELECT name, NULL FROM profile WHERE id = 0"
                } else {
                    "SELECT name, email FROM profile WHERE id = 0"
                };
                let rows = sql::query(select, &[])?;
                let row = rows.rows.first();
                let text = |i: usize| row.filter(|r| !r.is_null(i)).map(|r| r.text(i).to_owned());
                Ok(Response::json(
                    200,
                    json!({ "name": text(0), "email": text(1), "schema": schema }).to_string(),
                ))
            }
            _ => Ok(Response::not_found()),
        }
    }
}
