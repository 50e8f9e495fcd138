//! Runs a SELECT over rows: a table's active parts on this replica, or a
//! system table built for the query. WHERE, ORDER BY and LIMIT over
//! columns, literals, arithmetic, comparisons, `AND`/`OR`/`NOT`, `IN`,
//! `BETWEEN`, `intDiv`, `modulo`; a projection of expressions or of the
//! aggregates `count() sum() min() max()`; the server's `version()`,
//! `timezone()` and `currentDatabase()`. Integer arithmetic is exact
//! (128-bit) and an out-of-range result is an error, never a wrap.
//!
//! Every output column has a type, as ClickHouse's binary formats and
//! `JSON` state it: a column's declared type, and for an expression the
//! type ClickHouse would give it among drift's three (a difference or a
//! negation is `Int64`, a comparison `UInt64`, a string literal `String`).

use super::decl::function_args;
use super::error::{TResult, TableError, BAD_ARGUMENTS, ILLEGAL_TYPE_OF_ARGUMENT, NOT_IMPLEMENTED, UNKNOWN_IDENTIFIER};
use super::query::SelectQuery;
use drift_table::schema::{ColumnType, Value};
use sqlparser::ast::{BinaryOperator, Expr, InTarget, SelectItem, UnaryOperator, Value as SqlValue};
use std::cmp::Ordering;

/// What `version()` answers: drift's own version.
pub const SERVER_VERSION: &str = env!("CARGO_PKG_VERSION");
/// What `timezone()` answers: drift's tables hold no times.
pub const SERVER_TIMEZONE: &str = "UTC";

/// Rows with named, typed columns.
pub struct Relation {
    pub names: Vec<String>,
    pub types: Vec<ColumnType>,
    pub rows: Vec<Vec<Value>>,
}

impl Relation {
    /// A relation whose columns are given as (name, type) pairs.
    pub fn new(columns: &[(&str, ColumnType)], rows: Vec<Vec<Value>>) -> Relation {
        Relation {
            names: columns.iter().map(|(n, _)| n.to_string()).collect(),
            types: columns.iter().map(|(_, t)| *t).collect(),
            rows,
        }
    }
}

/// A query's result: output column names, their types, the rows.
#[derive(Debug)]
pub struct Output {
    pub names: Vec<String>,
    pub types: Vec<ColumnType>,
    pub rows: Vec<Vec<Value>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Cell {
    I(i128),
    S(String),
}

impl Cell {
    fn of(v: &Value) -> Cell {
        match v {
            Value::String(s) => Cell::S(s.clone()),
            other => Cell::I(other.as_i128().expect("integer")),
        }
    }

    fn compare(&self, o: &Cell) -> Ordering {
        match (self, o) {
            (Cell::I(a), Cell::I(b)) => a.cmp(b),
            (Cell::S(a), Cell::S(b)) => a.cmp(b),
            (Cell::I(_), Cell::S(_)) => Ordering::Less,
            (Cell::S(_), Cell::I(_)) => Ordering::Greater,
        }
    }

    fn truthy(&self) -> bool {
        match self {
            Cell::I(v) => *v != 0,
            Cell::S(s) => !s.is_empty(),
        }
    }

    fn int(&self, what: &str) -> TResult<i128> {
        match self {
            Cell::I(v) => Ok(*v),
            Cell::S(_) => Err(TableError::new(
                ILLEGAL_TYPE_OF_ARGUMENT,
                format!("{what} needs numbers, got a String"),
            )),
        }
    }

    fn into_value(self) -> TResult<Value> {
        Ok(match self {
            Cell::S(s) => Value::String(s),
            Cell::I(v) if v >= 0 => Value::UInt64(
                u64::try_from(v).map_err(|_| TableError::new(BAD_ARGUMENTS, format!("{v} overflows UInt64")))?,
            ),
            Cell::I(v) => Value::Int64(
                i64::try_from(v).map_err(|_| TableError::new(BAD_ARGUMENTS, format!("{v} overflows Int64")))?,
            ),
        })
    }
}

fn bool_cell(b: bool) -> Cell {
    Cell::I(b as i128)
}

struct Ctx<'a> {
    names: &'a [String],
    types: &'a [ColumnType],
}

impl Ctx<'_> {
    fn column(&self, name: &str) -> TResult<usize> {
        self.names.iter().position(|n| n == name).ok_or_else(|| {
            TableError::new(
                UNKNOWN_IDENTIFIER,
                format!("Missing column: '{name}' (columns: {})", self.names.join(", ")),
            )
        })
    }

    fn eval(&self, e: &Expr, row: &[Value]) -> TResult<Cell> {
        Ok(match e {
            Expr::Identifier(i) => Cell::of(&row[self.column(&i.value)?]),
            Expr::CompoundIdentifier(parts) => {
                let last = parts.last().map(|p| p.value.as_str()).unwrap_or("");
                Cell::of(&row[self.column(last)?])
            }
            Expr::Value(v) => literal(&v.value)?,
            Expr::Nested(e) => self.eval(e, row)?,
            Expr::UnaryOp { op, expr } => {
                let v = self.eval(expr, row)?;
                match op {
                    UnaryOperator::Not => bool_cell(!v.truthy()),
                    UnaryOperator::Minus => Cell::I(-v.int("unary minus")?),
                    UnaryOperator::Plus => Cell::I(v.int("unary plus")?),
                    other => return Err(unsupported(other)),
                }
            }
            Expr::BinaryOp { left, op, right } => {
                let l = self.eval(left, row)?;
                if *op == BinaryOperator::And && !l.truthy() {
                    return Ok(bool_cell(false));
                }
                if *op == BinaryOperator::Or && l.truthy() {
                    return Ok(bool_cell(true));
                }
                let r = self.eval(right, row)?;
                binary(op, l, r)?
            }
            Expr::In {
                expr,
                target: InTarget::List(list),
                negated,
                ..
            } => {
                let v = self.eval(expr, row)?;
                let mut found = false;
                for item in list {
                    if self.eval(item, row)?.compare(&v) == Ordering::Equal {
                        found = true;
                        break;
                    }
                }
                bool_cell(found != *negated)
            }
            Expr::Between {
                expr,
                negated,
                low,
                high,
            } => {
                let v = self.eval(expr, row)?;
                let inside = v.compare(&self.eval(low, row)?) != Ordering::Less
                    && v.compare(&self.eval(high, row)?) != Ordering::Greater;
                bool_cell(inside != *negated)
            }
            Expr::Like {
                negated,
                expr,
                pattern,
                escape_char: None,
                any: false,
            }
            | Expr::ILike {
                negated,
                expr,
                pattern,
                escape_char: None,
                any: false,
            } => {
                let insensitive = matches!(e, Expr::ILike { .. });
                let (Cell::S(v), Cell::S(p)) = (self.eval(expr, row)?, self.eval(pattern, row)?) else {
                    return Err(TableError::new(ILLEGAL_TYPE_OF_ARGUMENT, "LIKE needs strings"));
                };
                let (v, p) = if insensitive {
                    (v.to_lowercase(), p.to_lowercase())
                } else {
                    (v, p)
                };
                bool_cell(like(v.as_bytes(), p.as_bytes()) != *negated)
            }
            Expr::Function(f) => {
                let name = f.name.to_string();
                let args = function_args(&f.args).ok_or_else(|| unsupported(&name))?;
                let vals: Vec<Cell> = args.iter().map(|a| self.eval(a, row)).collect::<TResult<_>>()?;
                match (name.as_str(), vals.as_slice()) {
                    ("version", []) => Cell::S(SERVER_VERSION.to_string()),
                    ("timezone" | "timeZone" | "serverTimezone", []) => Cell::S(SERVER_TIMEZONE.to_string()),
                    ("currentDatabase", []) => Cell::S("default".to_string()),
                    ("intDiv", [a, b]) => {
                        let (a, b) = (a.int("intDiv")?, b.int("intDiv")?);
                        if b == 0 {
                            return Err(TableError::new(BAD_ARGUMENTS, "Division by zero in intDiv"));
                        }
                        Cell::I(a / b)
                    }
                    ("modulo", [a, b]) => binary(&BinaryOperator::Modulo, a.clone(), b.clone())?,
                    ("toString", [a]) => Cell::S(match a {
                        Cell::I(v) => v.to_string(),
                        Cell::S(s) => s.clone(),
                    }),
                    ("length", [Cell::S(s)]) => Cell::I(s.len() as i128),
                    (n, _) if is_aggregate(n) => {
                        return Err(TableError::new(
                            BAD_ARGUMENTS,
                            format!("aggregate {n}() cannot be mixed with plain columns (there is no GROUP BY)"),
                        ))
                    }
                    _ => return Err(unsupported(format!("function {name} with {} arguments", vals.len()))),
                }
            }
            other => return Err(unsupported(other)),
        })
    }

    /// The type of `e`'s values (an expression that cannot be evaluated
    /// fails in `eval`, which runs on every row; with no rows, its type is
    /// still given).
    fn type_of(&self, e: &Expr) -> ColumnType {
        let signed = |a: ColumnType, b: ColumnType| {
            if a == ColumnType::Int64 || b == ColumnType::Int64 {
                ColumnType::Int64
            } else {
                ColumnType::UInt64
            }
        };
        match e {
            Expr::Identifier(i) => self
                .column(&i.value)
                .map(|c| self.types[c])
                .unwrap_or(ColumnType::String),
            Expr::CompoundIdentifier(parts) => {
                let last = parts.last().map(|p| p.value.as_str()).unwrap_or("");
                self.column(last).map(|c| self.types[c]).unwrap_or(ColumnType::String)
            }
            Expr::Value(v) => match v.value {
                SqlValue::SingleQuotedString(_) => ColumnType::String,
                _ => ColumnType::UInt64,
            },
            Expr::Nested(e) => self.type_of(e),
            Expr::UnaryOp {
                op: UnaryOperator::Minus,
                ..
            } => ColumnType::Int64,
            Expr::UnaryOp {
                op: UnaryOperator::Plus,
                expr,
            } => self.type_of(expr),
            Expr::BinaryOp { left, op, right } => match op {
                BinaryOperator::Minus => ColumnType::Int64,
                BinaryOperator::Plus | BinaryOperator::Multiply | BinaryOperator::Divide | BinaryOperator::Modulo => {
                    signed(self.type_of(left), self.type_of(right))
                }
                _ => ColumnType::UInt64,
            },
            Expr::Function(f) => {
                let name = f.name.to_string();
                let args = function_args(&f.args).unwrap_or_default();
                match (name.as_str(), args.as_slice()) {
                    ("version" | "timezone" | "timeZone" | "serverTimezone" | "currentDatabase" | "toString", _) => {
                        ColumnType::String
                    }
                    ("intDiv" | "modulo", [a, b]) => signed(self.type_of(a), self.type_of(b)),
                    ("sum" | "min" | "max", [a]) => self.type_of(a),
                    _ => ColumnType::UInt64,
                }
            }
            _ => ColumnType::UInt64,
        }
    }
}

/// SQL LIKE: `%` any run, `_` one byte, `\\` escapes the next byte.
/// Greedy with one backtrack point, so O(value × pattern) at worst.
fn like(v: &[u8], p: &[u8]) -> bool {
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < v.len() {
        let escaped = j + 1 < p.len() && p[j] == b'\\';
        if escaped && v[i] == p[j + 1] {
            i += 1;
            j += 2;
        } else if j < p.len() && !escaped && (p[j] == b'_' || (p[j] != b'%' && p[j] == v[i])) {
            i += 1;
            j += 1;
        } else if j < p.len() && p[j] == b'%' {
            star = Some((j, i));
            j += 1;
        } else if let Some((sj, si)) = star {
            j = sj + 1;
            i = si + 1;
            star = Some((sj, si + 1));
        } else {
            return false;
        }
    }
    while j < p.len() && p[j] == b'%' {
        j += 1;
    }
    j == p.len()
}

#[cfg(test)]
#[test]
fn like_matches_as_sql_does() {
    for (v, p, want) in [
        ("abc", "a%", true),
        ("abc", "%c", true),
        ("abc", "a_c", true),
        ("abc", "a_", false),
        ("a%c", "a\\%c", true),
        ("abc", "a\\%c", false),
        ("", "%", true),
        ("aaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "%a%a%a%a%a%a%a%a%c", false),
    ] {
        assert_eq!(like(v.as_bytes(), p.as_bytes()), want, "{v} LIKE {p}");
    }
}

fn unsupported(what: impl std::fmt::Display) -> TableError {
    TableError::new(NOT_IMPLEMENTED, format!("{what} is not supported in drift's SELECT"))
}

fn literal(v: &SqlValue) -> TResult<Cell> {
    match v {
        SqlValue::Number(n, _) => n
            .parse::<i128>()
            .map(Cell::I)
            .map_err(|_| TableError::new(BAD_ARGUMENTS, format!("{n}: only integer literals"))),
        SqlValue::SingleQuotedString(s) => Ok(Cell::S(s.clone())),
        SqlValue::Boolean(b) => Ok(bool_cell(*b)),
        other => Err(unsupported(other)),
    }
}

/// A constant expression (a literal, maybe negated) as the text a cell is
/// parsed from: what `VALUES` rows hold.
pub fn constant_text(e: &Expr) -> Result<String, String> {
    match e {
        Expr::Value(v) => match &v.value {
            SqlValue::Number(n, _) => Ok(n.clone()),
            SqlValue::SingleQuotedString(s) => Ok(s.clone()),
            other => Err(format!("{other} is not a value drift stores")),
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => Ok(format!("-{}", constant_text(expr)?)),
        Expr::Nested(e) => constant_text(e),
        other => Err(format!("{other} is not a constant")),
    }
}

fn binary(op: &BinaryOperator, l: Cell, r: Cell) -> TResult<Cell> {
    use BinaryOperator::*;
    Ok(match op {
        Eq => bool_cell(l.compare(&r) == Ordering::Equal),
        NotEq => bool_cell(l.compare(&r) != Ordering::Equal),
        Lt => bool_cell(l.compare(&r) == Ordering::Less),
        LtEq => bool_cell(l.compare(&r) != Ordering::Greater),
        Gt => bool_cell(l.compare(&r) == Ordering::Greater),
        GtEq => bool_cell(l.compare(&r) != Ordering::Less),
        And => bool_cell(l.truthy() && r.truthy()),
        Or => bool_cell(l.truthy() || r.truthy()),
        Plus | Minus | Multiply | Modulo | Divide => {
            let (a, b) = (l.int("arithmetic")?, r.int("arithmetic")?);
            let v = match op {
                Plus => a.checked_add(b),
                Minus => a.checked_sub(b),
                Multiply => a.checked_mul(b),
                Modulo | Divide if b == 0 => return Err(TableError::new(BAD_ARGUMENTS, "Division by zero")),
                Modulo => Some(a % b),
                _ => Some(a / b),
            };
            Cell::I(v.ok_or_else(|| TableError::new(BAD_ARGUMENTS, "integer overflow"))?)
        }
        other => return Err(unsupported(other)),
    })
}

fn is_aggregate(name: &str) -> bool {
    matches!(name, "count" | "sum" | "min" | "max")
}

fn aggregate_of(e: &Expr) -> Option<(&str, Vec<&Expr>)> {
    let Expr::Function(f) = e else { return None };
    let name = f.name.0.last()?.as_ident()?.value.as_str();
    if !is_aggregate(name) {
        return None;
    }
    let args = match &f.args {
        sqlparser::ast::FunctionArguments::List(l) => l
            .args
            .iter()
            .filter_map(|a| match a {
                sqlparser::ast::FunctionArg::Unnamed(sqlparser::ast::FunctionArgExpr::Expr(e)) => Some(e),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    Some((name, args))
}

fn output_name(item: &SelectItem) -> String {
    match item {
        SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
        SelectItem::UnnamedExpr(Expr::Identifier(i)) => i.value.clone(),
        SelectItem::UnnamedExpr(e) => e.to_string(),
        other => other.to_string(),
    }
}

/// Runs `q` over `rel`.
pub fn run(q: &SelectQuery, rel: Relation) -> TResult<Output> {
    let ctx = Ctx {
        names: &rel.names,
        types: &rel.types,
    };
    let mut rows = Vec::with_capacity(rel.rows.len());
    for row in rel.rows {
        let keep = match &q.filter {
            None => true,
            Some(f) => ctx.eval(f, &row)?.truthy(),
        };
        if keep {
            rows.push(row);
        }
    }
    let exprs: Vec<&Expr> = q
        .items
        .iter()
        .filter_map(|i| match i {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => Some(e),
            _ => None,
        })
        .collect();
    if exprs.iter().any(|e| aggregate_of(e).is_some()) {
        if exprs.len() != q.items.len() || !exprs.iter().all(|e| aggregate_of(e).is_some()) {
            return Err(TableError::new(
                BAD_ARGUMENTS,
                "aggregates cannot be mixed with plain columns or * (there is no GROUP BY)",
            ));
        }
        let mut out = Vec::new();
        for e in &exprs {
            let (name, args) = aggregate_of(e).expect("checked");
            let v = match (name, args.as_slice()) {
                ("count", _) => Value::UInt64(rows.len() as u64),
                (agg, [arg]) => {
                    let cells: Vec<Cell> = rows.iter().map(|r| ctx.eval(arg, r)).collect::<TResult<_>>()?;
                    match agg {
                        "sum" => {
                            let mut s: i128 = 0;
                            for c in &cells {
                                s = s
                                    .checked_add(c.int("sum")?)
                                    .ok_or_else(|| TableError::new(BAD_ARGUMENTS, "sum overflows"))?;
                            }
                            Cell::I(s).into_value()?
                        }
                        "min" => cells
                            .into_iter()
                            .min_by(|a, b| a.compare(b))
                            .unwrap_or(Cell::I(0))
                            .into_value()?,
                        _ => cells
                            .into_iter()
                            .max_by(|a, b| a.compare(b))
                            .unwrap_or(Cell::I(0))
                            .into_value()?,
                    }
                }
                (agg, _) => return Err(TableError::new(BAD_ARGUMENTS, format!("{agg}() takes one argument"))),
            };
            out.push(v);
        }
        return Ok(Output {
            names: q.items.iter().map(output_name).collect(),
            types: exprs
                .iter()
                .map(|e| match aggregate_of(e) {
                    Some(("count", _)) => ColumnType::UInt64,
                    _ => ctx.type_of(e),
                })
                .collect(),
            rows: vec![out],
        });
    }
    if !q.order_by.is_empty() {
        let mut keyed: Vec<(Vec<Cell>, Vec<Value>)> = Vec::with_capacity(rows.len());
        for r in rows {
            let k = q
                .order_by
                .iter()
                .map(|(e, _)| ctx.eval(e, &r))
                .collect::<TResult<_>>()?;
            keyed.push((k, r));
        }
        keyed.sort_by(|a, b| {
            for (i, (_, desc)) in q.order_by.iter().enumerate() {
                let o = a.0[i].compare(&b.0[i]);
                let o = if *desc { o.reverse() } else { o };
                if o != Ordering::Equal {
                    return o;
                }
            }
            Ordering::Equal
        });
        rows = keyed.into_iter().map(|(_, r)| r).collect();
    }
    if let Some(n) = q.limit {
        rows.truncate(n.min(usize::MAX as u64) as usize);
    }
    let mut names = Vec::new();
    let mut types = Vec::new();
    enum Out<'e> {
        Col(usize),
        Expr(&'e Expr),
    }
    let mut outs = Vec::new();
    for item in &q.items {
        match item {
            SelectItem::Wildcard(_) => {
                for (i, n) in rel.names.iter().enumerate() {
                    names.push(n.clone());
                    types.push(rel.types[i]);
                    outs.push(Out::Col(i));
                }
            }
            SelectItem::UnnamedExpr(Expr::Identifier(i))
            | SelectItem::ExprWithAlias {
                expr: Expr::Identifier(i),
                ..
            } => {
                names.push(output_name(item));
                let c = ctx.column(&i.value)?;
                types.push(rel.types[c]);
                outs.push(Out::Col(c));
            }
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                names.push(output_name(item));
                types.push(ctx.type_of(e));
                outs.push(Out::Expr(e));
            }
            other => return Err(unsupported(other)),
        }
    }
    let mut out_rows = Vec::with_capacity(rows.len());
    for r in &rows {
        let mut o = Vec::with_capacity(outs.len());
        for out in &outs {
            o.push(match out {
                Out::Col(i) => r[*i].clone(),
                Out::Expr(e) => ctx.eval(e, r)?.into_value()?,
            });
        }
        out_rows.push(o);
    }
    Ok(Output {
        names,
        types,
        rows: out_rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::query::{parse, Command};

    fn rel() -> Relation {
        Relation::new(
            &[("id", ColumnType::UInt64), ("s", ColumnType::String)],
            (1..=10u64)
                .map(|i| vec![Value::UInt64(i), Value::String(format!("v{}", i % 3))])
                .collect(),
        )
    }

    fn typed(sql: &str) -> Output {
        let Command::Select(s) = parse(sql).unwrap() else {
            panic!()
        };
        run(&s, rel()).unwrap()
    }

    fn q(sql: &str) -> (Vec<String>, Vec<Vec<Value>>) {
        let o = typed(sql);
        (o.names, o.rows)
    }

    #[test]
    fn filters_orders_projects_and_aggregates() {
        let (names, rows) =
            q("SELECT id, intDiv(id, 4) AS p FROM t WHERE s = 'v1' AND id IN (1, 4, 7, 9) ORDER BY id DESC");
        assert_eq!(names, ["id", "p"]);
        assert_eq!(
            rows,
            vec![
                vec![Value::UInt64(7), Value::UInt64(1)],
                vec![Value::UInt64(4), Value::UInt64(1)],
                vec![Value::UInt64(1), Value::UInt64(0)]
            ]
        );
        let (names, rows) = q("SELECT count(), sum(id), max(s) FROM t WHERE id BETWEEN 2 AND 5");
        assert_eq!(names, ["count()", "sum(id)", "max(s)"]);
        assert_eq!(
            rows,
            vec![vec![Value::UInt64(4), Value::UInt64(14), Value::String("v2".into())]]
        );
        let (_, rows) = q("SELECT * FROM t ORDER BY s, id DESC LIMIT 2");
        assert_eq!(rows[0][0], Value::UInt64(9));
        let (_, rows) = q("SELECT count() FROM t WHERE s LIKE 'v_' AND s NOT LIKE '%2'");
        assert_eq!(rows[0][0], Value::UInt64(7));
        let (_, rows) = q("SELECT id - 20 FROM t LIMIT 1");
        assert_eq!(rows[0][0], Value::Int64(-19));
    }

    #[test]
    fn every_output_column_is_typed_rows_or_none() {
        use ColumnType::*;
        let o = typed("SELECT version(), timezone(), currentDatabase()");
        assert_eq!(o.types, [String, String, String]);
        assert_eq!(
            o.rows[0],
            [
                Value::String(SERVER_VERSION.into()),
                Value::String("UTC".into()),
                Value::String("default".into())
            ]
        );
        let o = typed("SELECT *, id - 1, id + 1, -id, id = 2, 'x', toString(id) FROM t WHERE id > 100");
        assert!(o.rows.is_empty());
        assert_eq!(o.types, [UInt64, String, Int64, UInt64, Int64, UInt64, String, String]);
        let o = typed("SELECT count(), sum(id), min(s) FROM t WHERE id > 100");
        assert_eq!(o.types, [UInt64, UInt64, String]);
    }

    #[test]
    fn bad_selects_are_errors() {
        let Command::Select(s) = parse("SELECT nope FROM t").unwrap() else {
            panic!()
        };
        assert_eq!(run(&s, rel()).unwrap_err().code, UNKNOWN_IDENTIFIER);
        let Command::Select(s) = parse("SELECT id, count() FROM t").unwrap() else {
            panic!()
        };
        assert_eq!(run(&s, rel()).unwrap_err().code, BAD_ARGUMENTS);
        let Command::Select(s) = parse("SELECT intDiv(id, 0) FROM t").unwrap() else {
            panic!()
        };
        assert_eq!(run(&s, rel()).unwrap_err().code, BAD_ARGUMENTS);
    }
}
