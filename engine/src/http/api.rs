//! The HTTP API's wire format, shaped like Cloudflare D1's REST API. This
//! module is the only place that reads or writes it.
//!
//! ```text
//! POST /v1/databases/{name}/query    (and /raw, below)
//!   x-d1-bookmark: first-primary | first-unconstrained | <bookmark>   (optional)
//!   body: {"sql": "...", "params": [...]}            one query
//!       | [{"sql": ..., "params": [...]}, ...]       an atomic batch
//!       | {"batch": [{"sql": ..., "params": [...]}, ...]}   the same (Cloudflare's form)
//!   params: null | true/false (as 1/0) | number | string
//!
//!   A query's "sql" may hold several statements joined by semicolons
//!   ("CREATE TABLE t(x); INSERT INTO t VALUES (1); SELECT * FROM t"):
//!   SQLite delimits them one at a time as they run, they run as one
//!   atomic transaction (all or nothing), and there is one result per
//!   statement. "params" bind to the LAST statement (D1's rule for a
//!   prepared statement holding several queries); an earlier statement
//!   that takes parameters is a 400 (code 7500). On a replica, several
//!   statements containing a write go to the primary, as a batch does.
//!
//! 200  x-d1-bookmark: <the session's bookmark after the request>
//!   {"result": [{"results": [{"col": value, ...}, ...],
//!                "success": true,
//!                "meta": {"served_by_primary": bool, "served_by_region": "...",
//!                         "bookmark": "...", "rows_read": n, "rows_written": n,
//!                         "changes": n, "last_row_id": n, "duration": ms}}, ...],
//!    "success": true, "errors": [], "messages": []}
//! 4xx/5xx
//!   {"result": [], "success": false,
//!    "errors": [{"code": n, "message": "..."}], "messages": []}
//! ```
//!
//! `POST /v1/databases/{name}/raw` takes the same bodies; each result's
//! `results` holds the rows as arrays, with the column names (so
//! duplicate names survive), D1's raw shape:
//!
//! ```text
//! 200 {"result": [{"results": {"columns": ["a", "a"], "rows": [[1, 2], ...]},
//!                  "success": true, "meta": {...}}, ...],
//!      "success": true, "errors": [], "messages": []}
//! ```
//!
//! Export and import: `super::dump` (the dump's format) and
//! `super::transfer` (the endpoints).
//!
//! Time travel (D1's shape; see `super::time_travel`):
//!
//! ```text
//! GET  /v1/databases/{name}/time_travel/bookmark?timestamp=<RFC 3339 | Unix seconds>
//! 200  {"result": {"bookmark": "..."}, "success": true, "errors": [], "messages": []}
//! POST /v1/databases/{name}/time_travel/restore?bookmark=<b> | ?timestamp=<t>
//! 200  {"result": {"bookmark": "<the restore's own commit>",
//!                  "previous_bookmark": "<the state before it>",
//!                  "message": "..."}, "success": true, "errors": [], "messages": []}
//! ```
//!
//! Result values: null, integers and reals as numbers, text as strings,
//! blobs as arrays of byte values (as D1 returns them).

use crate::session::{Meta, QueryResult, RawResult};
use crate::value::Value;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// The session header, in requests and responses.
pub const BOOKMARK_HEADER: &str = "x-d1-bookmark";

/// One statement of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub sql: String,
    pub params: Vec<Value>,
}

/// A parsed request body.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    One(Statement),
    Batch(Vec<Statement>),
}

/// Why a body is not a valid request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("malformed JSON: {0}")]
    Json(String),
    #[error(
        "the body must be {{\"sql\": ..., \"params\": [...]}}, an array of them or {{\"batch\": [...]}}"
    )]
    Shape,
    #[error("statement {index}: \"sql\" must be a string")]
    Sql { index: usize },
    #[error("statement {index}: \"params\" must be an array")]
    ParamsNotArray { index: usize },
    #[error(
        "statement {index}, parameter {param}: {kind} is not a supported parameter type (null, boolean, number or string)"
    )]
    ParamType {
        index: usize,
        param: usize,
        kind: &'static str,
    },
    #[error("an empty batch")]
    EmptyBatch,
}

fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn statement(index: usize, v: &Json) -> Result<Statement, BodyError> {
    let Json::Object(o) = v else {
        return Err(BodyError::Shape);
    };
    if o.keys().any(|k| k != "sql" && k != "params") {
        return Err(BodyError::Shape);
    }
    let Some(Json::String(sql)) = o.get("sql") else {
        return Err(BodyError::Sql { index });
    };
    let params = match o.get("params") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(param, p)| match p {
                Json::Null => Ok(Value::Null),
                Json::Bool(b) => Ok(Value::Integer(i64::from(*b))),
                Json::Number(n) => Ok(match n.as_i64() {
                    Some(i) => Value::Integer(i),
                    None => Value::Real(n.as_f64().unwrap_or(f64::NAN)),
                }),
                Json::String(s) => Ok(Value::Text(s.clone())),
                other => Err(BodyError::ParamType {
                    index,
                    param,
                    kind: kind(other),
                }),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(BodyError::ParamsNotArray { index }),
    };
    Ok(Statement {
        sql: sql.clone(),
        params,
    })
}

/// One statement as the common request sends it, read straight into its
/// types: [`parse_body`]'s fast path, which accepts only what the general
/// path below accepts and gives the same statement.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OneIn<'a> {
    #[serde(borrow)]
    sql: std::borrow::Cow<'a, str>,
    #[serde(default)]
    params: Option<Vec<ParamIn>>,
}

/// A parameter of [`OneIn`]: the types and conversions of `statement`'s.
struct ParamIn(Value);

impl<'de> Deserialize<'de> for ParamIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ParamIn, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = ParamIn;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("null, a boolean, a number or a string")
            }
            fn visit_unit<E>(self) -> Result<ParamIn, E> {
                Ok(ParamIn(Value::Null))
            }
            fn visit_bool<E>(self, b: bool) -> Result<ParamIn, E> {
                Ok(ParamIn(Value::Integer(i64::from(b))))
            }
            fn visit_i64<E>(self, i: i64) -> Result<ParamIn, E> {
                Ok(ParamIn(Value::Integer(i)))
            }
            fn visit_u64<E>(self, u: u64) -> Result<ParamIn, E> {
                // As serde_json's `as_i64`, then `as_f64`.
                Ok(ParamIn(match i64::try_from(u) {
                    Ok(i) => Value::Integer(i),
                    Err(_) => Value::Real(u as f64),
                }))
            }
            fn visit_f64<E>(self, r: f64) -> Result<ParamIn, E> {
                Ok(ParamIn(Value::Real(r)))
            }
            fn visit_str<E>(self, s: &str) -> Result<ParamIn, E> {
                Ok(ParamIn(Value::Text(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<ParamIn, E> {
                Ok(ParamIn(Value::Text(s)))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// Parses a request body (its size was bounded before it was read).
///
/// The common body, one statement object, is read straight into its
/// types; anything else that path does not take (a batch, an error of any
/// kind, a repeated key) is read again through `serde_json::Value`, which
/// gives every error its precise kind.
pub fn parse_body(bytes: &[u8]) -> Result<Body, BodyError> {
    if let Ok(one) = serde_json::from_slice::<OneIn<'_>>(bytes) {
        return Ok(Body::One(Statement {
            sql: one.sql.into_owned(),
            params: one
                .params
                .map(|ps| ps.into_iter().map(|p| p.0).collect())
                .unwrap_or_default(),
        }));
    }
    let v: Json = serde_json::from_slice(bytes).map_err(|e| BodyError::Json(e.to_string()))?;
    match &v {
        Json::Array(items) => {
            if items.is_empty() {
                return Err(BodyError::EmptyBatch);
            }
            Ok(Body::Batch(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, s)| statement(i, s))
                    .collect::<Result<_, _>>()?,
            ))
        }
        Json::Object(o) if o.contains_key("batch") => {
            if o.len() != 1 {
                return Err(BodyError::Shape);
            }
            match o.get("batch") {
                Some(Json::Array(items)) if items.is_empty() => Err(BodyError::EmptyBatch),
                Some(Json::Array(items)) => Ok(Body::Batch(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, s)| statement(i, s))
                        .collect::<Result<_, _>>()?,
                )),
                _ => Err(BodyError::Shape),
            }
        }
        Json::Object(_) => Ok(Body::One(statement(0, &v)?)),
        _ => Err(BodyError::Shape),
    }
}

/// Encodes a request body (the client side).
pub fn encode_body(body: &Body) -> Json {
    let one = |s: &Statement| {
        serde_json::json!({
            "sql": s.sql,
            "params": s.params.iter().map(value_json).collect::<Vec<_>>(),
        })
    };
    match body {
        Body::One(s) => one(s),
        Body::Batch(ss) => Json::Array(ss.iter().map(one).collect()),
    }
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Integer(i) => Json::from(*i),
        Value::Real(r) => serde_json::Number::from_f64(*r).map_or(Json::Null, Json::Number),
        Value::Text(s) => Json::String(s.clone()),
        Value::Blob(b) => Json::Array(b.iter().map(|x| Json::from(*x)).collect()),
    }
}

/// D1's meta object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetaJson {
    pub served_by_primary: bool,
    pub served_by_region: String,
    pub bookmark: String,
    pub rows_read: u64,
    pub rows_written: u64,
    pub changes: u64,
    pub last_row_id: i64,
    /// Milliseconds, as D1 reports it.
    pub duration: f64,
}

impl From<&Meta> for MetaJson {
    fn from(m: &Meta) -> MetaJson {
        MetaJson {
            served_by_primary: m.served_by_primary,
            served_by_region: m.served_by_region.clone(),
            bookmark: m.bookmark.to_string(),
            rows_read: m.rows_read,
            rows_written: m.rows_written,
            changes: m.changes,
            last_row_id: m.last_row_id,
            duration: m.duration_us as f64 / 1000.0,
        }
    }
}

/// One statement's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultJson {
    pub results: Vec<Map<String, Json>>,
    pub success: bool,
    pub meta: MetaJson,
}

impl From<&QueryResult> for ResultJson {
    fn from(r: &QueryResult) -> ResultJson {
        ResultJson {
            results: r
                .results
                .iter()
                .map(|row| {
                    row.columns()
                        .iter()
                        .zip(row.values())
                        .map(|(c, v)| (c.clone(), value_json(v)))
                        .collect()
                })
                .collect(),
            success: true,
            meta: MetaJson::from(&r.meta),
        }
    }
}

impl From<&RawResult> for ResultJson {
    /// Rows as objects: a later column of the same name wins, as in D1.
    fn from(r: &RawResult) -> ResultJson {
        ResultJson {
            results: r
                .rows
                .iter()
                .map(|row| {
                    r.columns
                        .iter()
                        .zip(row)
                        .map(|(c, v)| (c.clone(), value_json(v)))
                        .collect()
                })
                .collect(),
            success: true,
            meta: MetaJson::from(&r.meta),
        }
    }
}

/// Any result's meta alone (where it was served), for counting.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MetaOnlyJson {
    pub meta: MetaJson,
}

/// D1's raw rows: column names, then each row as an array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RawRowsJson {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Json>>,
}

/// One statement's result in the raw shape (`/raw`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RawResultJson {
    pub results: RawRowsJson,
    pub success: bool,
    pub meta: MetaJson,
}

impl From<&RawResult> for RawResultJson {
    fn from(r: &RawResult) -> RawResultJson {
        RawResultJson {
            results: RawRowsJson {
                columns: r.columns.clone(),
                rows: r
                    .rows
                    .iter()
                    .map(|row| row.iter().map(value_json).collect())
                    .collect(),
            },
            success: true,
            meta: MetaJson::from(&r.meta),
        }
    }
}

/// How a response lays out rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `/query`: rows as objects.
    Objects,
    /// `/raw`: columns and rows as arrays.
    Arrays,
}

/// A successful response's body, in `shape`.
pub fn encode_results(results: &[RawResult], shape: Shape) -> Vec<u8> {
    let encoded = match shape {
        Shape::Objects => serde_json::to_vec(&Envelope::ok(
            results.iter().map(ResultJson::from).collect::<Vec<_>>(),
        )),
        Shape::Arrays => serde_json::to_vec(&Envelope::ok(
            results.iter().map(RawResultJson::from).collect::<Vec<_>>(),
        )),
    };
    encoded.unwrap_or_default()
}

/// Cloudflare's REST envelope around any result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<T> {
    pub result: T,
    pub success: bool,
    pub errors: Vec<ErrorJson>,
    pub messages: Vec<String>,
}

impl<T> Envelope<T> {
    pub fn ok(result: T) -> Envelope<T> {
        Envelope {
            result,
            success: true,
            errors: Vec::new(),
            messages: Vec::new(),
        }
    }
}

/// One error entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorJson {
    pub code: u32,
    pub message: String,
}

/// The whole response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub result: Vec<ResultJson>,
    pub success: bool,
    pub errors: Vec<ErrorJson>,
    pub messages: Vec<String>,
}

impl Response {
    pub fn ok(results: &[QueryResult]) -> Response {
        Response {
            result: results.iter().map(ResultJson::from).collect(),
            success: true,
            errors: Vec::new(),
            messages: Vec::new(),
        }
    }

    pub fn error(code: u32, message: impl Into<String>) -> Response {
        Response {
            result: Vec::new(),
            success: false,
            errors: vec![ErrorJson {
                code,
                message: message.into(),
            }],
            messages: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_statement_and_a_batch_parse_with_typed_parameters() {
        let b = parse_body(
            br#"{"sql":"SELECT ?1, ?2, ?3, ?4, ?5","params":[1, 2.5, "x", null, true]}"#,
        )
        .expect("valid");
        assert_eq!(
            b,
            Body::One(Statement {
                sql: "SELECT ?1, ?2, ?3, ?4, ?5".into(),
                params: vec![
                    Value::Integer(1),
                    Value::Real(2.5),
                    Value::Text("x".into()),
                    Value::Null,
                    Value::Integer(1)
                ],
            })
        );
        let b =
            parse_body(br#"[{"sql":"INSERT INTO t VALUES (1)"},{"sql":"SELECT 1","params":[]}]"#)
                .expect("batch");
        assert!(matches!(&b, Body::Batch(v) if v.len() == 2));
        assert_eq!(
            parse_body(&serde_json::to_vec(&encode_body(&b)).expect("json")),
            Ok(b)
        );
    }

    /// The general path alone, for comparison with the fast one.
    fn parse_through_value(bytes: &[u8]) -> Result<Body, BodyError> {
        let v: Json = serde_json::from_slice(bytes).map_err(|e| BodyError::Json(e.to_string()))?;
        Ok(Body::One(statement(0, &v)?))
    }

    #[test]
    fn the_fast_path_gives_what_the_general_path_gives_for_one_statement() {
        for body in [
            r#"{"sql":"SELECT v FROM kv WHERE id = ?1","params":[42]}"#,
            r#"{"params":[1, -7, 2.5, 1e2, -0, "x\"y\u00e9", null, true, false],"sql":"S"}"#,
            r#"{"sql":"SELECT 1","params":null}"#,
            r#"{"sql":"SELECT 1"}"#,
            r#"{"sql":"with \n escapes \u0041","params":[]}"#,
            r#"{"sql":"S","params":[9223372036854775807, 9223372036854775808, 18446744073709551615]}"#,
            r#"{"sql":"S","params":[-9223372036854775808, 1.7976931348623157e308, 5e-324]}"#,
            " \n{\"sql\" : \"S\" } \t",
        ] {
            let fast = serde_json::from_slice::<OneIn<'_>>(body.as_bytes());
            assert!(fast.is_ok(), "the fast path takes {body}");
            assert_eq!(
                parse_body(body.as_bytes()),
                parse_through_value(body.as_bytes()),
                "{body}"
            );
        }
    }

    #[test]
    fn what_the_fast_path_refuses_gets_the_general_paths_answer() {
        for body in [
            r#"{"sql":"S","sql":"T"}"#,
            r#"{"sql":"S","params":[[1]]}"#,
            r#"{"sql":"S","params":[{"a":1}]}"#,
            r#"{"sql":"S","params":{"a":1}}"#,
            r#"{"sql":1}"#,
            r#"{"params":[]}"#,
            r#"{"sql":"S","extra":1}"#,
            r#"{"sql":"S"} trailing"#,
        ] {
            assert!(
                serde_json::from_slice::<OneIn<'_>>(body.as_bytes()).is_err(),
                "the fast path refuses {body}"
            );
            assert_eq!(
                parse_body(body.as_bytes()),
                parse_through_value(body.as_bytes()),
                "{body}"
            );
        }
        // A repeated key: the last one wins, as before the fast path.
        assert_eq!(
            parse_body(br#"{"sql":"S","sql":"T"}"#),
            Ok(Body::One(Statement {
                sql: "T".into(),
                params: Vec::new()
            }))
        );
    }

    #[test]
    fn bad_bodies_are_typed_errors() {
        assert!(matches!(parse_body(b"{"), Err(BodyError::Json(_))));
        assert_eq!(parse_body(b"42"), Err(BodyError::Shape));
        assert_eq!(parse_body(b"[]"), Err(BodyError::EmptyBatch));
        assert_eq!(
            parse_body(br#"{"sql": 1}"#),
            Err(BodyError::Sql { index: 0 })
        );
        assert_eq!(
            parse_body(br#"{"sql": "SELECT 1", "params": {"a": 1}}"#),
            Err(BodyError::ParamsNotArray { index: 0 })
        );
        assert_eq!(
            parse_body(br#"[{"sql": "SELECT 1"}, {"sql": "SELECT ?", "params": [[1]]}]"#),
            Err(BodyError::ParamType {
                index: 1,
                param: 0,
                kind: "an array"
            })
        );
        assert_eq!(
            parse_body(br#"{"sql": "SELECT 1", "extra": 1}"#),
            Err(BodyError::Shape)
        );
    }
}

/// A time-travel answer's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeTravelResult {
    pub bookmark: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_bookmark: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A successful time-travel answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeTravelResponse {
    pub result: TimeTravelResult,
    pub success: bool,
    pub errors: Vec<ErrorJson>,
    pub messages: Vec<String>,
}

impl TimeTravelResponse {
    pub fn ok(result: TimeTravelResult) -> TimeTravelResponse {
        TimeTravelResponse {
            result,
            success: true,
            errors: Vec::new(),
            messages: Vec::new(),
        }
    }
}
