//! A `[[table]]` of the cluster file as a schema: the column list, the
//! partition key and the order key are SQL, read with sqlparser's
//! ClickHouse dialect.

use crate::config::TableDecl;
use drift_table::schema::{Column, ColumnType, PartitionKey, Schema, TableSettings};
use sqlparser::ast::{DataType, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Value};
use sqlparser::dialect::ClickHouseDialect;
use sqlparser::parser::Parser;

fn parser(sql: &str) -> Result<Parser<'static>, String> {
    Parser::new(&ClickHouseDialect {})
        .try_with_sql(sql)
        .map_err(|e| format!("{sql:?}: {e}"))
}

fn column_type(t: &DataType) -> Option<ColumnType> {
    match t {
        DataType::UInt64 => Some(ColumnType::UInt64),
        DataType::Int64 => Some(ColumnType::Int64),
        DataType::String(None) => Some(ColumnType::String),
        DataType::Custom(name, args) if args.is_empty() => ColumnType::parse(&name.to_string()),
        _ => None,
    }
}

fn columns(sql: &str) -> Result<Vec<Column>, String> {
    let mut p = parser(sql)?;
    let defs = p
        .parse_comma_separated(|p| p.parse_column_def())
        .map_err(|e| format!("columns {sql:?}: {e}"))?;
    if p.peek_token().token != sqlparser::tokenizer::Token::EOF {
        return Err(format!(
            "columns {sql:?}: unexpected {} after the columns",
            p.peek_token()
        ));
    }
    defs.into_iter()
        .map(|d| {
            let ty = column_type(&d.data_type).ok_or_else(|| {
                format!(
                    "column {}: type {} (drift tables have UInt64, Int64, String)",
                    d.name, d.data_type
                )
            })?;
            if !d.options.is_empty() {
                return Err(format!("column {}: no column options are supported", d.name));
            }
            Ok(Column { name: d.name.value, ty })
        })
        .collect()
}

fn expr(sql: &str) -> Result<Expr, String> {
    let mut p = parser(sql)?;
    let e = p.parse_expr().map_err(|e| format!("{sql:?}: {e}"))?;
    if p.peek_token().token != sqlparser::tokenizer::Token::EOF {
        return Err(format!("{sql:?}: unexpected {} after the expression", p.peek_token()));
    }
    Ok(e)
}

fn column_of(e: &Expr, cols: &[Column]) -> Result<usize, String> {
    match e {
        Expr::Identifier(id) => cols
            .iter()
            .position(|c| c.name == id.value)
            .ok_or_else(|| format!("no column {}", id.value)),
        other => Err(format!("expected a column, got {other}")),
    }
}

/// Unnamed plain arguments of a function call.
pub fn function_args(args: &FunctionArguments) -> Option<Vec<&Expr>> {
    match args {
        FunctionArguments::None => Some(Vec::new()),
        FunctionArguments::List(l) => l
            .args
            .iter()
            .map(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            })
            .collect(),
        FunctionArguments::Subquery(_) => None,
    }
}

fn partition_key(sql: Option<&str>, cols: &[Column]) -> Result<PartitionKey, String> {
    let Some(sql) = sql else {
        return Ok(PartitionKey::None);
    };
    let e = expr(sql)?;
    let bad = || format!("partition_by {sql:?}: expected a column, intDiv(column, N) or tuple()");
    match &e {
        Expr::Identifier(_) => Ok(PartitionKey::Column(column_of(&e, cols)?)),
        Expr::Function(f) => {
            let name = f.name.to_string();
            let args = function_args(&f.args).ok_or_else(bad)?;
            match (name.as_str(), args.as_slice()) {
                ("tuple", []) => Ok(PartitionKey::None),
                ("intDiv", [c, Expr::Value(v)]) => match &v.value {
                    Value::Number(n, _) => {
                        let n: u64 = n.parse().map_err(|_| bad())?;
                        Ok(PartitionKey::IntDiv(column_of(c, cols)?, n))
                    }
                    _ => Err(bad()),
                },
                _ => Err(bad()),
            }
        }
        Expr::Tuple(t) if t.is_empty() => Ok(PartitionKey::None),
        _ => Err(bad()),
    }
}

fn order_key(sql: Option<&str>, cols: &[Column]) -> Result<Vec<usize>, String> {
    let Some(sql) = sql else {
        return Ok(Vec::new());
    };
    match expr(sql)? {
        Expr::Tuple(items) => items.iter().map(|e| column_of(e, cols)).collect(),
        Expr::Nested(e) => Ok(vec![column_of(&e, cols)?]),
        Expr::Function(f) if f.name.to_string() == "tuple" => function_args(&f.args)
            .ok_or(format!("order_by {sql:?}: expected columns"))?
            .into_iter()
            .map(|e| column_of(e, cols))
            .collect(),
        e => Ok(vec![
            column_of(&e, cols).map_err(|why| format!("order_by {sql:?}: {why}"))?
        ]),
    }
}

/// The table's schema, or what is wrong with its declaration.
pub fn schema(d: &TableDecl) -> Result<Schema, String> {
    let at = |e: String| format!("table {}: {e}", d.name);
    let cols = columns(&d.columns).map_err(at)?;
    let partition_key = partition_key(d.partition_by.as_deref(), &cols).map_err(at)?;
    let order_key = order_key(d.order_by.as_deref(), &cols).map_err(at)?;
    let s = &d.settings;
    let dflt = TableSettings::default();
    let settings = TableSettings {
        replicated_deduplication_window: s
            .replicated_deduplication_window
            .unwrap_or(dflt.replicated_deduplication_window),
        replicated_deduplication_window_seconds: s
            .replicated_deduplication_window_seconds
            .unwrap_or(dflt.replicated_deduplication_window_seconds),
        cleanup_delay_period_ms: s.cleanup_delay_period_ms.unwrap_or(dflt.cleanup_delay_period_ms),
        min_replicated_logs_to_keep: s
            .min_replicated_logs_to_keep
            .unwrap_or(dflt.min_replicated_logs_to_keep),
        max_replicated_logs_to_keep: s
            .max_replicated_logs_to_keep
            .unwrap_or(dflt.max_replicated_logs_to_keep),
        max_parts_to_merge_at_once: s.max_parts_to_merge_at_once.unwrap_or(dflt.max_parts_to_merge_at_once),
        parts_to_merge_min: s.parts_to_merge_min.unwrap_or(dflt.parts_to_merge_min),
        fetch_pool_size: s.fetch_pool_size.unwrap_or(dflt.fetch_pool_size),
        merge_pool_size: s.merge_pool_size.unwrap_or(dflt.merge_pool_size),
        merge_selecting_period_ms: s.merge_selecting_period_ms.unwrap_or(dflt.merge_selecting_period_ms),
        zookeeper_path: s
            .zookeeper_path
            .clone()
            .unwrap_or_else(|| format!("/clickhouse/tables/{}", d.name)),
    };
    if !settings.zookeeper_path.starts_with('/') || settings.zookeeper_path.ends_with('/') {
        return Err(at(format!(
            "zookeeper_path {:?} must start with / and not end with one",
            settings.zookeeper_path
        )));
    }
    let schema = Schema {
        name: d.name.clone(),
        columns: cols,
        partition_key,
        order_key,
        settings,
    };
    schema.validate().map_err(at)?;
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TableSettingsDecl;

    fn decl(columns: &str, partition_by: Option<&str>, order_by: Option<&str>) -> TableDecl {
        TableDecl {
            name: "t".into(),
            columns: columns.into(),
            partition_by: partition_by.map(str::to_string),
            order_by: order_by.map(str::to_string),
            settings: TableSettingsDecl::default(),
        }
    }

    #[test]
    fn declarations_become_schemas() {
        let s = schema(&decl(
            "id UInt64, key String, v Int64",
            Some("intDiv(id, 1000)"),
            Some("(key, id)"),
        ))
        .unwrap();
        assert_eq!(s.columns.len(), 3);
        assert_eq!(s.partition_key, PartitionKey::IntDiv(0, 1000));
        assert_eq!(s.order_key, vec![1, 0]);
        assert_eq!(s.settings.zookeeper_path, "/clickhouse/tables/t");
        let s = schema(&decl("id UInt64", Some("tuple()"), Some("id"))).unwrap();
        assert_eq!((s.partition_key, s.order_key), (PartitionKey::None, vec![0]));
        let s = schema(&decl("id UInt64, p Int64", Some("p"), None)).unwrap();
        assert_eq!(s.partition_key, PartitionKey::Column(1));
    }

    #[test]
    fn bad_declarations_say_what_is_wrong() {
        for (d, says) in [
            (decl("id Float64", None, None), "type"),
            (decl("id UInt64,", None, None), "columns"),
            (decl("id UInt64", Some("intDiv(x, 10)"), None), "no column x"),
            (decl("id UInt64", Some("id + 1"), None), "partition_by"),
            (decl("id UInt64", None, Some("nope")), "no column nope"),
            (decl("s String", Some("intDiv(s, 10)"), None), "intDiv of String"),
        ] {
            let e = schema(&d).unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
    }
}
