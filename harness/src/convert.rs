//! `drift convert IN OUT`: a history as drift's JSON Lines — from Jepsen's
//! `history.edn` (see `drift_checkers::edn`), or from JSON Lines (which
//! checks and renumbers it). Errors name the input's file and line; the
//! output is written only from a history read whole.

use crate::cli::ConvertArgs;
use crate::fail::Failure;
use drift_checkers::{HistoryReader, HistoryWriter, Op};

pub fn run(args: ConvertArgs) -> Result<i32, Failure> {
    let ops = read(&args.input)?;
    if args.output.exists() && !args.force {
        return Err(Failure::new(format!(
            "{}: exists (--force replaces it)",
            args.output.display()
        )));
    }
    let mut w =
        HistoryWriter::create(&args.output).map_err(|e| Failure::new(format!("{}: {e}", args.output.display())))?;
    for op in &ops {
        w.append_buffered(op)
            .map_err(|e| Failure::new(format!("{}: {e}", args.output.display())))?;
    }
    w.flush()
        .map_err(|e| Failure::new(format!("{}: {e}", args.output.display())))?;
    out!(
        "{} operations: {} -> {}",
        ops.len(),
        args.input.display(),
        args.output.display()
    );
    Ok(0)
}

fn read(path: &std::path::Path) -> Result<Vec<Op>, Failure> {
    use std::io::Read;
    let mut head = vec![0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .map_err(|e| Failure::new(format!("{}: {e}", path.display())))?;
    head.truncate(n);
    if drift_checkers::edn::is_edn(path, &head) {
        let (ops, _) = drift_checkers::edn::read(path).map_err(|e| Failure::new(e.to_string()))?;
        return Ok(ops);
    }
    let reader = HistoryReader::open(path).map_err(|e| Failure::new(e.to_string()))?;
    reader
        .collect::<Result<Vec<Op>, _>>()
        .map_err(|e| Failure::new(e.to_string()))
}
