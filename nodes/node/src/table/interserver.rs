//! Parts between replicas: `GET /part?table=T&part=P` on a replica's
//! interserver address answers the part's files in one body:
//!
//! ```text
//! drift-part 1\n
//! <file count>\n
//! <name>\t<length>\n<bytes>     for each file
//! ```
//!
//! The request is signed with the cluster's secret (`crate::http_auth`):
//! a server without it gets nothing. The sender checks the part against
//! its checksums before it serves it;
//! the receiver parses within limits and the caller checks the files
//! against `checksums.txt` before anything is written, so a corrupt or
//! truncated transfer is refused and retried, never installed.

use drift_table::format::FILE_BYTES_MAX;
use drift_table::schema::COLUMNS_MAX;
use std::collections::BTreeMap;

/// Most files a part transfer may carry.
const FILES_MAX: usize = COLUMNS_MAX + 3;
/// Longest file name in a transfer.
const FILE_NAME_BYTES_MAX: usize = 128;

pub fn encode(files: &BTreeMap<String, Vec<u8>>, corrupt: bool, truncate: bool) -> Vec<u8> {
    let mut out = format!("drift-part 1\n{}\n", files.len()).into_bytes();
    for (name, bytes) in files {
        out.extend_from_slice(format!("{name}\t{}\n", bytes.len()).as_bytes());
        let start = out.len();
        out.extend_from_slice(bytes);
        if corrupt && name.ends_with(".bin") && !bytes.is_empty() {
            out[start + bytes.len() / 2] ^= 0x20;
        }
    }
    if truncate {
        out.truncate(out.len() * 2 / 3);
    }
    out
}

fn line<'a>(body: &'a [u8], at: &mut usize) -> Result<&'a str, String> {
    let end = body[*at..]
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("transfer ends inside a header line")?;
    let l = std::str::from_utf8(&body[*at..*at + end]).map_err(|_| "a header line is not UTF-8")?;
    *at += end + 1;
    Ok(l)
}

pub fn decode(body: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let mut at = 0;
    if line(body, &mut at)? != "drift-part 1" {
        return Err("not a drift part transfer".into());
    }
    let n: usize = line(body, &mut at)?.parse().map_err(|_| "bad file count")?;
    if n > FILES_MAX {
        return Err(format!("{n} files in a part (most {FILES_MAX})"));
    }
    let mut files = BTreeMap::new();
    for _ in 0..n {
        let header = line(body, &mut at)?;
        let (name, len) = header.split_once('\t').ok_or("bad file header")?;
        let len: u64 = len.parse().map_err(|_| "bad file length")?;
        if name.len() > FILE_NAME_BYTES_MAX || name.contains('/') || name.starts_with('.') {
            return Err(format!("bad file name {name:?}"));
        }
        if len > FILE_BYTES_MAX || at as u64 + len > body.len() as u64 {
            return Err(format!(
                "file {name}: {len} bytes, {} left in the transfer (truncated?)",
                body.len() - at
            ));
        }
        files.insert(name.to_string(), body[at..at + len as usize].to_vec());
        at += len as usize;
    }
    if at != body.len() {
        return Err(format!("{} bytes after the last file", body.len() - at));
    }
    Ok(files)
}

/// Fetches `part` of `table` from the replica at `host`, the request
/// signed (see `crate::http_auth`).
pub async fn fetch(
    http: &reqwest::Client,
    signer: &crate::http_auth::Signer,
    host: &str,
    table: &str,
    part: &str,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let target = format!("/part?table={table}&part={part}");
    let url = format!("http://{host}{target}");
    let resp = http
        .get(&url)
        .header(crate::http_auth::HEADER, signer.header("GET", &target, b""))
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| format!("GET {url}: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "GET {url}: {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(300)]).trim()
        ));
    }
    decode(&body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_round_trip_and_damage_is_caught_or_left_to_the_checksums() {
        let files = BTreeMap::from([
            ("a.bin".to_string(), vec![1u8; 100]),
            ("checksums.txt".to_string(), b"x".to_vec()),
        ]);
        assert_eq!(decode(&encode(&files, false, false)).unwrap(), files);
        assert!(decode(&encode(&files, false, true)).is_err());
        let corrupt = decode(&encode(&files, true, false)).unwrap();
        assert_ne!(corrupt, files, "a flipped byte decodes; the checksums catch it");
        assert!(decode(b"drift-part 1\n1\n../x\t1\nA").is_err());
        assert!(decode(b"drift-part 1\n999\n").is_err());
    }
}
