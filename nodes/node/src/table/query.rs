//! Queries the table's HTTP interface understands, read with sqlparser's
//! ClickHouse dialect:
//!
//! * `INSERT INTO t [(cols)] FORMAT <fmt>` with the data after it (in the
//!   query or the request body), and `INSERT INTO t [(cols)] VALUES (…)`;
//! * `SELECT … FROM t | system.parts | system.replicas |
//!   system.replication_queue | system.events [WHERE …] [ORDER BY …]
//!   [LIMIT n] [FORMAT fmt]` — columns, `*`, arithmetic, comparisons,
//!   `intDiv`, and the aggregates `count() sum() min() max()`;
//! * `SELECT` of constants and `version()`, `timezone()`,
//!   `currentDatabase()` with no `FROM`, and of `system.settings`,
//!   `system.tables`, `system.columns`, `system.databases`;
//! * `DESCRIBE [TABLE] t`, `EXISTS [TABLE] t`, `SHOW TABLES [FROM db]`,
//!   `SHOW DATABASES`, each with an optional `FORMAT fmt` — what
//!   ClickHouse's clients ask a server when they connect and insert;
//! * `SYSTEM SYNC REPLICA t`, `SYSTEM STOP|START FETCHES|MERGES t`;
//! * `OPTIMIZE TABLE t [FINAL]`.
//!
//! Anything else is refused with the error ClickHouse would give for a
//! query it cannot run (a syntax error, or NOT_IMPLEMENTED naming what).

use super::error::{TResult, TableError, BAD_ARGUMENTS, NOT_IMPLEMENTED, SYNTAX_ERROR};
use super::formats::Format;
use sqlparser::ast::{
    Expr, GroupByExpr, LimitClause, ObjectName, OrderByKind, OrderBySort, SelectItem, SetExpr, Statement, TableFactor,
    TableObject, Value,
};
use sqlparser::dialect::ClickHouseDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, Tokenizer};

/// Longest query text (the SQL, not an insert's data).
pub const QUERY_BYTES_MAX: usize = 256 * 1024;

#[derive(Debug)]
pub enum Command {
    Insert(InsertQuery),
    Select(Box<SelectQuery>),
    SyncReplica(String),
    Fetches(String, bool),
    Merges(String, bool),
    Optimize {
        table: String,
        final_: bool,
    },
    /// `ALTER TABLE t DROP PARTITION <value> | ID '<id>'`: the partition id.
    DropPartition {
        table: String,
        partition: String,
    },
}

#[derive(Debug)]
pub struct InsertQuery {
    pub table: String,
    pub columns: Vec<String>,
    pub data: InsertData,
}

#[derive(Debug)]
pub enum InsertData {
    /// Rows in `format`, starting with `inline` (what followed the format
    /// name in the query) and continuing with the request body.
    Formatted { format: Format, inline: String },
    /// `VALUES (…), (…)`.
    Values(Vec<Vec<Expr>>),
}

#[derive(Debug)]
pub enum Source {
    None,
    Table(String),
    System(String),
    /// `DESCRIBE TABLE t`: the table's columns.
    Describe(String),
    /// `EXISTS TABLE t`: one row, `result` 1 or 0.
    Exists(String),
    /// `SHOW TABLES [FROM db]`: the tables' names.
    Tables(String),
    /// `SHOW DATABASES`.
    Databases,
}

#[derive(Debug)]
pub struct SelectQuery {
    pub from: Source,
    pub items: Vec<SelectItem>,
    pub filter: Option<Expr>,
    pub order_by: Vec<(Expr, bool)>,
    pub limit: Option<u64>,
    pub format: Option<Format>,
}

fn syntax(e: impl std::fmt::Display) -> TableError {
    TableError::new(SYNTAX_ERROR, format!("Syntax error: {e}"))
}

fn unsupported(what: impl std::fmt::Display) -> TableError {
    TableError::new(NOT_IMPLEMENTED, format!("{what} is not supported by drift's table"))
}

/// `db.t` or `t` (`default.t` is `t`); `system.x` keeps its prefix.
fn table_name(n: &ObjectName) -> TResult<(Option<String>, String)> {
    let parts: Vec<String> =
        n.0.iter()
            .map(|p| {
                p.as_ident()
                    .map(|i| i.value.clone())
                    .ok_or_else(|| syntax(format!("table name {n}")))
            })
            .collect::<TResult<_>>()?;
    match parts.as_slice() {
        [t] => Ok((None, t.clone())),
        [db, t] => Ok((Some(db.clone()), t.clone())),
        _ => Err(syntax(format!("table name {n}"))),
    }
}

fn local_table(n: &ObjectName) -> TResult<String> {
    match table_name(n)? {
        (None, t) => Ok(t),
        (Some(db), t) if db == "default" => Ok(t),
        (Some(db), _) => Err(TableError::new(
            super::error::UNKNOWN_DATABASE,
            format!("Database {db} does not exist (drift's tables are in `default`)"),
        )),
    }
}

/// Where the `FORMAT <name>` of an `INSERT` in `q` ends, and the name.
pub fn insert_format_end(q: &str) -> Option<(usize, &str)> {
    let first = q
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    if !first.eq_ignore_ascii_case("INSERT") {
        return None;
    }
    find_insert_format(q)
}

/// Where `FORMAT <name>` of an insert ends: outside quotes, the first
/// `FORMAT` word followed by a name. Returns (end of the name, name).
fn find_insert_format(q: &str) -> Option<(usize, &str)> {
    let b = q.as_bytes();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(qc) => {
                if c == b'\\' {
                    i += 1;
                } else if c == qc {
                    quote = None;
                }
            }
            None if c == b'\'' || c == b'"' || c == b'`' => quote = Some(c),
            None if c == b'(' && q[..i].to_ascii_uppercase().trim_end().ends_with("VALUES") => return None,
            None => {
                let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
                if boundary
                    && b.len() >= i + 7
                    && q[i..i + 6].eq_ignore_ascii_case("FORMAT")
                    && b[i + 6].is_ascii_whitespace()
                {
                    let rest = &q[i + 6..];
                    let name_start = i + 6 + (rest.len() - rest.trim_start().len());
                    let name_len = q[name_start..]
                        .bytes()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == b'_')
                        .count();
                    if name_len == 0 {
                        return None;
                    }
                    return Some((name_start + name_len, &q[name_start..name_start + name_len]));
                }
            }
        }
        i += 1;
    }
    None
}

fn words(q: &str) -> TResult<Vec<String>> {
    let tokens = Tokenizer::new(&ClickHouseDialect {}, q).tokenize().map_err(syntax)?;
    Ok(tokens
        .into_iter()
        .filter(|t| !matches!(t, Token::Whitespace(_) | Token::SemiColon))
        .map(|t| match t {
            Token::Word(w) => w.value,
            other => other.to_string(),
        })
        .collect())
}

/// `SYSTEM …` commands, which sqlparser does not know.
fn system_command(q: &str) -> TResult<Command> {
    let w = words(q)?;
    let upper: Vec<String> = w.iter().map(|s| s.to_ascii_uppercase()).collect();
    let table = |i: usize| -> TResult<String> {
        let rest = &w[i..];
        let name = match rest {
            [t] => t.clone(),
            [db, dot, t] if dot == "." && db == "default" => t.clone(),
            _ => return Err(syntax(format!("expected a table after {}", upper[..i].join(" ")))),
        };
        Ok(name)
    };
    match upper.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["SYSTEM", "SYNC", "REPLICA", ..] => Ok(Command::SyncReplica(table(3)?)),
        ["SYSTEM", "STOP", "FETCHES", ..] => Ok(Command::Fetches(table(3)?, false)),
        ["SYSTEM", "START", "FETCHES", ..] => Ok(Command::Fetches(table(3)?, true)),
        ["SYSTEM", "STOP", "MERGES", ..] => Ok(Command::Merges(table(3)?, false)),
        ["SYSTEM", "START", "MERGES", ..] => Ok(Command::Merges(table(3)?, true)),
        _ => Err(unsupported(format!("`{}`", w.join(" ")))),
    }
}

/// `ALTER TABLE t DROP PARTITION …`, in ClickHouse's syntax (a bare
/// value, which sqlparser would want in parentheses, or `ID '…'`).
fn alter_command(q: &str) -> TResult<Command> {
    let w = words(q)?;
    let upper: Vec<String> = w.iter().map(|s| s.to_ascii_uppercase()).collect();
    let u: Vec<&str> = upper.iter().map(String::as_str).collect();
    let (table, rest) = match u.as_slice() {
        ["ALTER", "TABLE", _, "DROP", "PARTITION", ..] => (w[2].clone(), &w[5..]),
        ["ALTER", "TABLE", db, ".", _, "DROP", "PARTITION", ..] if db.eq_ignore_ascii_case("default") => {
            (w[4].clone(), &w[7..])
        }
        _ => return Err(unsupported(format!("`{}`", w.join(" ")))),
    };
    let value = match rest {
        [id, v] if id.eq_ignore_ascii_case("ID") => v.clone(),
        [v] => v.clone(),
        [l, v, r] if l == "(" && r == ")" => v.clone(),
        _ => return Err(syntax("DROP PARTITION takes one value (or ID 'id')")),
    };
    let partition = value.trim_matches('\'').to_string();
    if !drift_table::schema::valid_partition_id(&partition) {
        return Err(TableError::new(
            BAD_ARGUMENTS,
            format!("{partition:?} is not a partition id of an integer key"),
        ));
    }
    Ok(Command::DropPartition { table, partition })
}

/// `DESCRIBE`, `EXISTS` and `SHOW`, which ClickHouse writes in ways
/// sqlparser does not read, as SELECTs of all a relation's columns.
fn meta_command(q: &str) -> TResult<Command> {
    let mut w = words(q)?;
    let mut format = None;
    if w.len() >= 2 && w[w.len() - 2].eq_ignore_ascii_case("FORMAT") {
        format = Some(Format::parse(&w[w.len() - 1])?);
        w.truncate(w.len() - 2);
    }
    let upper: Vec<String> = w.iter().map(|s| s.to_ascii_uppercase()).collect();
    let u: Vec<&str> = upper.iter().map(String::as_str).collect();
    // `t`, `default.t` or `db.t`, after `skip` words
    let table = |skip: usize| -> TResult<String> {
        match &w[skip..] {
            [t] => Ok(t.clone()),
            [db, dot, t] if dot == "." && db == "default" => Ok(t.clone()),
            [db, dot, t] if dot == "." && db == "system" => Ok(format!("system.{t}")),
            [db, dot, _] if dot == "." => Err(TableError::new(
                super::error::UNKNOWN_DATABASE,
                format!("Database {db} does not exist (drift's tables are in `default`)"),
            )),
            _ => Err(syntax(format!("expected one table name in `{}`", w.join(" ")))),
        }
    };
    let from = match u.as_slice() {
        ["DESCRIBE" | "DESC", "TABLE", ..] => Source::Describe(table(2)?),
        ["DESCRIBE" | "DESC", ..] => Source::Describe(table(1)?),
        ["EXISTS", "TABLE", ..] => Source::Exists(table(2)?),
        ["EXISTS", ..] => Source::Exists(table(1)?),
        ["SHOW", "TABLES"] => Source::Tables("default".into()),
        ["SHOW", "TABLES", "FROM" | "IN", _] => Source::Tables(w[3].clone()),
        ["SHOW", "DATABASES"] => Source::Databases,
        _ => return Err(unsupported(format!("`{}`", w.join(" ")))),
    };
    Ok(Command::Select(Box::new(SelectQuery {
        from,
        items: vec![SelectItem::Wildcard(Default::default())],
        filter: None,
        order_by: Vec::new(),
        limit: None,
        format,
    })))
}

/// Parses a query. For an insert with a format, `inline` data is what
/// followed the format name in `q` (the body continues it).
#[cfg(test)]
pub fn parse(q: &str) -> TResult<Command> {
    parse_with_settings(q).map(|(c, _)| c)
}

/// A query's command and the settings its `SETTINGS` clause gives (name
/// and value as text, in order), for the caller to apply over the URL's
/// as ClickHouse does (the query's win).
pub fn parse_with_settings(q: &str) -> TResult<(Command, Vec<(String, String)>)> {
    let trimmed = q.trim_start();
    let first = trimmed
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase();
    if first == "SYSTEM" {
        return system_command(trimmed).map(|c| (c, Vec::new()));
    }
    if first == "ALTER" {
        return alter_command(trimmed).map(|c| (c, Vec::new()));
    }
    if matches!(first.as_str(), "DESCRIBE" | "DESC" | "EXISTS" | "SHOW") {
        return meta_command(trimmed).map(|c| (c, Vec::new()));
    }
    let (sql, inline) = match (first.as_str(), find_insert_format(trimmed)) {
        ("INSERT", Some((end, _))) => {
            let rest = &trimmed[end..];
            // the data starts after one whitespace character
            let rest = rest
                .strip_prefix("\r\n")
                .or_else(|| rest.strip_prefix(['\n', ' ', '\t']))
                .unwrap_or(rest);
            (&trimmed[..end], Some(rest.to_string()))
        }
        _ => (trimmed, None),
    };
    if sql.len() > QUERY_BYTES_MAX {
        return Err(syntax(format!("query of {} bytes (most {QUERY_BYTES_MAX})", sql.len())));
    }
    // a select's closing `FORMAT <name>`, which sqlparser reads only after
    // a FROM (`SELECT 1 FORMAT JSON` would be `1 AS FORMAT`, then a stray
    // word): taken off here, for every select alike
    let (sql, trailing) = match trailing_format(sql) {
        Some((start, format)) if first == "SELECT" => (&sql[..start], Some(format)),
        _ => (sql, None),
    };
    let mut statements = Parser::parse_sql(&ClickHouseDialect {}, sql).map_err(syntax)?;
    if statements.len() != 1 {
        return Err(syntax(format!(
            "{} statements in one query (send one)",
            statements.len()
        )));
    }
    match statements.remove(0) {
        Statement::Insert(mut ins) => {
            let settings = settings_of(ins.settings.take())?;
            Ok((insert(ins, inline)?, settings))
        }
        Statement::Query(mut q) => {
            let settings = settings_of(q.settings.take())?;
            let mut query = select(*q)?;
            if let Some(format) = trailing {
                if query.format.is_some() {
                    return Err(syntax("two FORMAT clauses in one query"));
                }
                query.format = Some(format);
            }
            Ok((Command::Select(Box::new(query)), settings))
        }
        Statement::OptimizeTable {
            name,
            include_final,
            partition,
            deduplicate,
            ..
        } => {
            if partition.is_some() || deduplicate.is_some() {
                return Err(unsupported("OPTIMIZE with PARTITION or DEDUPLICATE"));
            }
            Ok((
                Command::Optimize {
                    table: local_table(&name)?,
                    final_: include_final,
                },
                Vec::new(),
            ))
        }
        other => Err(unsupported(format!(
            "`{}`",
            other.to_string().chars().take(60).collect::<String>()
        ))),
    }
}

/// A query's closing `FORMAT <name>`: where it starts, and the format.
/// Its last two tokens, past whitespace, comments and semicolons, must be
/// the unquoted word `FORMAT` and a format's name (a name that is none is
/// left to sqlparser: `ORDER BY format DESC` ends in two such words).
fn trailing_format(sql: &str) -> Option<(usize, Format)> {
    if !sql.to_ascii_uppercase().contains("FORMAT") {
        return None;
    }
    let tokens = Tokenizer::new(&ClickHouseDialect {}, sql)
        .tokenize_with_location()
        .ok()?;
    let mut words = tokens
        .iter()
        .rev()
        .filter(|t| !matches!(t.token, Token::Whitespace(_) | Token::SemiColon));
    let (Some(name), Some(keyword)) = (words.next(), words.next()) else {
        return None;
    };
    let (Token::Word(n), Token::Word(k)) = (&name.token, &keyword.token) else {
        return None;
    };
    if n.quote_style.is_some() || k.quote_style.is_some() || !k.value.eq_ignore_ascii_case("FORMAT") {
        return None;
    }
    let format = Format::parse(&n.value).ok()?;
    // the keyword's line and column (1-based, in characters) as a byte offset
    let at = keyword.span.start;
    let line_start: usize = sql
        .split_inclusive('\n')
        .take((at.line as usize).checked_sub(1)?)
        .map(str::len)
        .sum();
    let column = sql[line_start..]
        .char_indices()
        .nth((at.column as usize).checked_sub(1)?)?
        .0;
    Some((line_start + column, format))
}

/// A `SETTINGS` clause's settings as text: a number, a string or a
/// bare word each.
fn settings_of(clause: Option<Vec<sqlparser::ast::Setting>>) -> TResult<Vec<(String, String)>> {
    clause
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let value = match &s.value {
                Expr::Value(v) => match &v.value {
                    Value::Number(n, _) => n.clone(),
                    Value::SingleQuotedString(t) => t.clone(),
                    Value::Boolean(b) => u8::from(*b).to_string(),
                    other => {
                        return Err(syntax(format!(
                            "SETTINGS {} = {other}: not a number or a string",
                            s.key
                        )))
                    }
                },
                Expr::Identifier(i) => i.value.clone(),
                other => {
                    return Err(syntax(format!(
                        "SETTINGS {} = {other}: not a number or a string",
                        s.key
                    )))
                }
            };
            Ok((s.key.value, value))
        })
        .collect()
}

fn insert(ins: sqlparser::ast::Insert, inline: Option<String>) -> TResult<Command> {
    let TableObject::TableName(name) = &ins.table else {
        return Err(unsupported("INSERT INTO a table function"));
    };
    let table = local_table(name)?;
    let columns = ins
        .columns
        .iter()
        .map(|c| c.to_string().trim_matches('`').to_string())
        .collect();
    let data = match (ins.format_clause, ins.source) {
        (Some(f), None) => InsertData::Formatted {
            format: Format::parse(&f.ident.value)?,
            inline: inline.unwrap_or_default(),
        },
        (None, Some(q)) => match *q.body {
            SetExpr::Values(v) => InsertData::Values(v.rows.into_iter().map(|r| r.content).collect()),
            _ => return Err(unsupported("INSERT … SELECT")),
        },
        (None, None) => {
            return Err(syntax("INSERT needs FORMAT <name> or VALUES"));
        }
        (Some(_), Some(_)) => return Err(syntax("INSERT with both FORMAT and a source")),
    };
    Ok(Command::Insert(InsertQuery { table, columns, data }))
}

fn select(q: sqlparser::ast::Query) -> TResult<SelectQuery> {
    if q.with.is_some() || q.fetch.is_some() || !q.locks.is_empty() || !q.pipe_operators.is_empty() {
        return Err(unsupported("WITH, FETCH, locks and pipes"));
    }
    let format = match &q.format_clause {
        None => None,
        Some(sqlparser::ast::FormatClause::Identifier(i)) => Some(Format::parse(&i.value)?),
        Some(sqlparser::ast::FormatClause::Null) => return Err(unsupported("FORMAT Null")),
    };
    let limit = match &q.limit_clause {
        None => None,
        Some(LimitClause::LimitOffset {
            limit: Some(Expr::Value(v)),
            offset: None,
            limit_by,
        }) if limit_by.is_empty() => match &v.value {
            Value::Number(n, _) => Some(n.parse::<u64>().map_err(|_| syntax(format!("LIMIT {n}")))?),
            _ => return Err(syntax("LIMIT needs a number")),
        },
        Some(_) => return Err(unsupported("OFFSET and LIMIT BY")),
    };
    let order_by = match &q.order_by {
        None => Vec::new(),
        Some(o) => match &o.kind {
            OrderByKind::Expressions(es) => es
                .iter()
                .map(|e| (e.expr.clone(), matches!(e.options.sort, Some(OrderBySort::Desc))))
                .collect(),
            OrderByKind::All(_) => return Err(unsupported("ORDER BY ALL")),
        },
    };
    let SetExpr::Select(s) = *q.body else {
        return Err(unsupported("set operations (UNION, …) and VALUES as a query"));
    };
    let grouped = match &s.group_by {
        GroupByExpr::Expressions(e, m) => !e.is_empty() || !m.is_empty(),
        GroupByExpr::All(_) => true,
    };
    if grouped || s.having.is_some() || s.distinct.is_some() || !s.lateral_views.is_empty() || s.prewhere.is_some() {
        return Err(unsupported("GROUP BY, HAVING, DISTINCT and PREWHERE"));
    }
    let from = match s.from.as_slice() {
        [] => Source::None,
        [t] if t.joins.is_empty() => match &t.relation {
            TableFactor::Table { name, args: None, .. } => match table_name(name)? {
                (Some(db), t) if db == "system" => Source::System(t),
                _ => Source::Table(local_table(name)?),
            },
            _ => return Err(unsupported("subqueries and table functions in FROM")),
        },
        _ => return Err(unsupported("joins")),
    };
    Ok(SelectQuery {
        from,
        items: s.projection,
        filter: s.selection,
        order_by,
        limit,
        format,
    })
}

/// A URL setting's value as a bool (`1`/`0`/`true`/`false`).
pub fn bool_setting(name: &str, v: &str) -> TResult<bool> {
    match v {
        "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(TableError::new(
            BAD_ARGUMENTS,
            format!("setting {name}={v}: expected 0 or 1"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::error::UNKNOWN_FORMAT;

    #[test]
    fn inserts_split_the_data_off_at_the_format() {
        let Command::Insert(i) = parse("INSERT INTO t FORMAT JSONEachRow {\"a\":\"FORMAT x\"}").unwrap() else {
            panic!()
        };
        assert_eq!(i.table, "t");
        match i.data {
            InsertData::Formatted { format, inline } => {
                assert_eq!(format, Format::JsonEachRow);
                assert_eq!(inline, "{\"a\":\"FORMAT x\"}");
            }
            _ => panic!(),
        }
        let Command::Insert(i) = parse("insert into default.t (id, s) format TabSeparated\n1\tx\n").unwrap() else {
            panic!()
        };
        assert_eq!(i.columns, ["id", "s"]);
        let Command::Insert(i) = parse("INSERT INTO t VALUES (1, 'FORMAT x'), (2, 'b')").unwrap() else {
            panic!()
        };
        assert!(matches!(i.data, InsertData::Values(ref r) if r.len() == 2));
    }

    #[test]
    fn a_closing_format_is_read_with_or_without_a_from() {
        let format = |q: &str| match parse(q) {
            Ok(Command::Select(s)) => Ok(s.format),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e.code),
        };
        // as clickhouse-connect asks a server: a newline before FORMAT
        assert_eq!(format("SELECT 1\n FORMAT Native"), Ok(Some(Format::Native)));
        assert_eq!(format("SELECT version() format JSON;"), Ok(Some(Format::Json)));
        assert_eq!(format("SELECT 1 FORMAT JSON -- a comment"), Ok(Some(Format::Json)));
        assert_eq!(format("SELECT 'it''s', 'a\\tb' FORMAT CSV"), Ok(Some(Format::Csv)));
        assert_eq!(format("SELECT id FROM t ORDER BY format DESC"), Ok(None));
        assert_eq!(format("SELECT 1"), Ok(None));
        // a FORMAT inside a string, a comment or a longer word is no clause
        assert_eq!(format("SELECT 'x FORMAT JSON'"), Ok(None));
        assert_eq!(format("SELECT 1 -- FORMAT JSON"), Ok(None));
        assert_eq!(format("SELECT 1 AS myformat"), Ok(None));
        assert_eq!(format("SELECT 1 FROM t FORMAT Bogus"), Err(UNKNOWN_FORMAT));
        assert_eq!(format("SELECT 1 FROM t FORMAT JSON FORMAT CSV"), Err(SYNTAX_ERROR));
    }

    #[test]
    fn selects_system_commands_and_refusals() {
        let Command::Select(s) =
            parse("SELECT count() FROM t WHERE id > 3 ORDER BY id DESC LIMIT 5 FORMAT JSONEachRow").unwrap()
        else {
            panic!()
        };
        assert!(matches!(s.from, Source::Table(ref t) if t == "t"));
        assert_eq!((s.limit, s.order_by.len(), s.order_by[0].1), (Some(5), 1, true));
        let Command::Select(s) = parse("SELECT * FROM system.parts").unwrap() else {
            panic!()
        };
        assert!(matches!(s.from, Source::System(ref t) if t == "parts"));
        assert!(matches!(parse("SYSTEM SYNC REPLICA default.t").unwrap(), Command::SyncReplica(ref t) if t == "t"));
        assert!(matches!(
            parse("system stop fetches t").unwrap(),
            Command::Fetches(_, false)
        ));
        assert!(matches!(
            parse("OPTIMIZE TABLE t FINAL").unwrap(),
            Command::Optimize { final_: true, .. }
        ));
        assert_eq!(parse("SELEC 1").unwrap_err().code, SYNTAX_ERROR);
        assert_eq!(parse("SELECT a FROM t GROUP BY a").unwrap_err().code, NOT_IMPLEMENTED);
        assert_eq!(parse("DROP TABLE t").unwrap_err().code, NOT_IMPLEMENTED);
        assert!(
            matches!(parse("ALTER TABLE t DROP PARTITION 3").unwrap(), Command::DropPartition { ref partition, .. } if partition == "3")
        );
        assert!(
            matches!(parse("alter table default.t drop partition id '12'").unwrap(), Command::DropPartition { ref partition, .. } if partition == "12")
        );
        assert_eq!(parse("ALTER TABLE t DELETE WHERE 1").unwrap_err().code, NOT_IMPLEMENTED);
        assert_eq!(parse("SELECT 1; SELECT 2").unwrap_err().code, SYNTAX_ERROR);
        assert_eq!(
            parse("INSERT INTO t FORMAT Parquet x").unwrap_err().code,
            super::super::error::UNKNOWN_FORMAT
        );
    }

    #[test]
    fn describe_exists_and_show_read_as_clickhouse_clients_write_them() {
        let from = |q: &str| match parse(q).unwrap() {
            Command::Select(s) => (s.from, s.format),
            other => panic!("{other:?}"),
        };
        assert!(
            matches!(from("DESCRIBE TABLE `t`\n FORMAT Native"), (Source::Describe(ref t), Some(Format::Native)) if t == "t")
        );
        assert!(matches!(from("desc default.t"), (Source::Describe(ref t), None) if t == "t"));
        assert!(matches!(from("DESCRIBE system.settings"), (Source::Describe(ref t), None) if t == "system.settings"));
        assert!(
            matches!(from("EXISTS TABLE t FORMAT TabSeparated"), (Source::Exists(ref t), Some(Format::TabSeparated)) if t == "t")
        );
        assert!(matches!(from("EXISTS t;"), (Source::Exists(ref t), None) if t == "t"));
        assert!(matches!(from("SHOW TABLES"), (Source::Tables(ref d), None) if d == "default"));
        assert!(matches!(from("show tables from system"), (Source::Tables(ref d), None) if d == "system"));
        assert!(matches!(
            from("SHOW DATABASES FORMAT JSON"),
            (Source::Databases, Some(Format::Json))
        ));
        assert_eq!(
            parse("DESCRIBE other.t").unwrap_err().code,
            super::super::error::UNKNOWN_DATABASE
        );
        assert_eq!(parse("DESCRIBE").unwrap_err().code, SYNTAX_ERROR);
        assert_eq!(parse("SHOW CREATE TABLE t").unwrap_err().code, NOT_IMPLEMENTED);
    }

    #[test]
    fn a_settings_clause_is_read_on_selects_and_inserts() {
        let (c, st) =
            parse_with_settings("SELECT count() FROM t SETTINGS max_threads = 1, insert_quorum = 'auto'").unwrap();
        assert!(matches!(c, Command::Select(_)));
        assert_eq!(
            st,
            vec![
                ("max_threads".to_string(), "1".to_string()),
                ("insert_quorum".to_string(), "auto".to_string())
            ]
        );
        let (c, st) =
            parse_with_settings("INSERT INTO t SETTINGS insert_deduplicate = 0 FORMAT TabSeparated\n1\ta\n").unwrap();
        let Command::Insert(ins) = c else { panic!("an insert") };
        assert!(matches!(ins.data, InsertData::Formatted { ref inline, .. } if inline == "1\ta\n"));
        assert_eq!(st, vec![("insert_deduplicate".to_string(), "0".to_string())]);
        assert!(parse_with_settings("SELECT 1 FROM t").unwrap().1.is_empty());
        assert_eq!(
            parse_with_settings("SELECT 1 FROM t SETTINGS x = (1 + 1)")
                .unwrap_err()
                .code,
            SYNTAX_ERROR
        );
    }
}
