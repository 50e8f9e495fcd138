//! Snapshots: the whole state at a log index, deterministic, versioned,
//! compressed, as ClickHouse Keeper writes them.
//!
//! Inner format, version [`FORMAT_VERSION`]: `"DRIFTSNP" | format u8 |
//! crc32 of those 9 bytes | blocks`, each block `len u32 | crc32 u32 | bytes` (at most 64 KiB; a
//! zero-length block ends the stream). The blocks carry one body: a header
//! (identity = last log index and term, zxid, digest version and value,
//! counts), the ACL table sorted, nodes in path order, sessions sorted by
//! id. Two replicas at the same index therefore write byte-identical files.
//!
//! On disk the inner stream is zstd-compressed in independent frames of
//! 1 MiB input, or stored raw; the reader sniffs the zstd magic, so both
//! stay readable. Damage is reported with the file and the offset of the
//! frame or block it hit; a newer format is refused, not misparsed; a
//! snapshot whose recomputed digest differs from the one it carries is
//! refused.
//!
//! Writing: the file is written and synced as `tmp_<name>`, then renamed
//! to its name, so a crash leaves the old snapshots and perhaps a `tmp_`
//! file, which start-up ([`Snapshots::clean_incomplete`]) removes; a
//! snapshot under its own name is always whole.

use crate::acl::Acl;
use crate::codec::{DecodeError, Reader, Writer};
use crate::digest::{self, Digest, DIGEST_VERSION, NO_DIGEST};
use crate::disk::Disk;
use crate::node::{Kind, Node, Stat, DATA_BYTES_MAX};
use crate::path::{self, PATH_BYTES_MAX};
use crate::request::decode_acl;
use crate::state::{Frozen, Session, State};
use std::collections::BTreeMap;
use std::sync::Arc;

pub const PREFIX: &str = "snapshot_";
pub const TMP_PREFIX: &str = "tmp_";
const SUFFIX: &str = ".bin";
const MAGIC: &[u8; 8] = b"DRIFTSNP";
/// Magic, format byte and their CRC: the part every format version keeps,
/// so a newer version is told apart from damage.
const PROLOGUE_BYTES: usize = 13;
pub const FORMAT_VERSION: u8 = 1;
const BLOCK_BYTES: usize = 64 << 10;
const FRAME_INPUT_BYTES: usize = 1 << 20;
/// Bytes of a snapshot being written gathered before each append.
const WRITE_BYTES: usize = 4 << 20;
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];
/// Most nodes, sessions or ACLs a snapshot may declare.
const ITEMS_MAX: usize = 1 << 31;

/// What a snapshot is: its identity and the state's digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub last_index: u64,
    pub last_term: u64,
    pub zxid: i64,
    pub digest: Digest,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {file}: {error}")]
    Io {
        file: String,
        #[source]
        error: std::io::Error,
    },
    #[error("snapshot {file} is corrupt at offset {offset}: {reason}")]
    Corrupt { file: String, offset: u64, reason: String },
    #[error(
        "snapshot {file} has format version {version}, newer than this build reads ({}); refusing to load it",
        FORMAT_VERSION
    )]
    UnsupportedVersion { file: String, version: u8 },
    #[error(
        "snapshot {file} carries digest {:#018x} but its tree hashes to {computed:#018x}; refusing to load it",
        .stored.value
    )]
    DigestMismatch {
        file: String,
        stored: Digest,
        computed: u64,
    },
}

pub fn file_name(last_index: u64, last_term: u64) -> String {
    format!("{PREFIX}{last_index:020}_{last_term:020}{SUFFIX}")
}

/// (last index, last term) of a snapshot file name.
pub fn parse_name(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    let (i, t) = rest.split_once('_')?;
    Some((i.parse().ok()?, t.parse().ok()?))
}

// ---- encoding ----

fn encode_stat(w: &mut Writer, s: &Stat) {
    w.i64(s.czxid);
    w.i64(s.mzxid);
    w.i64(s.ctime);
    w.i64(s.mtime);
    w.i32(s.version);
    w.i32(s.cversion);
    w.i32(s.aversion);
    w.i64(s.ephemeral_owner);
    w.i32(s.data_length);
    w.i32(s.num_children);
    w.i64(s.pzxid);
}

fn decode_stat(r: &mut Reader<'_>) -> Result<Stat, DecodeError> {
    Ok(Stat {
        czxid: r.i64()?,
        mzxid: r.i64()?,
        ctime: r.i64()?,
        mtime: r.i64()?,
        version: r.i32()?,
        cversion: r.i32()?,
        aversion: r.i32()?,
        ephemeral_owner: r.i64()?,
        data_length: r.i32()?,
        num_children: r.i32()?,
        pzxid: r.i64()?,
    })
}

/// A snapshot's bytes as they are made: the body is cut into checksummed
/// blocks of [`BLOCK_BYTES`] as it fills, the framed stream into zstd
/// frames of [`FRAME_INPUT_BYTES`], and finished pieces go to `sink`; a
/// large tree's snapshot is never whole in memory. The pieces joined are
/// the same bytes whatever their sizes: magic, format, blocks, end block,
/// compressed in frames of exactly [`FRAME_INPUT_BYTES`] of that stream.
struct Stream<'s, E> {
    body: Writer,
    inner: Vec<u8>,
    z: Option<zstd::bulk::Compressor<'static>>,
    sink: &'s mut dyn FnMut(&[u8]) -> Result<(), E>,
}

impl<E> Stream<'_, E> {
    /// Frames every full block of the body, and passes on every full
    /// frame of the framed stream.
    fn flush_full(&mut self) -> Result<(), E> {
        while self.body.buf.len() >= BLOCK_BYTES {
            frame_block(&mut self.inner, &self.body.buf[..BLOCK_BYTES]);
            self.body.buf.drain(..BLOCK_BYTES);
        }
        while self.inner.len() >= FRAME_INPUT_BYTES {
            self.emit(FRAME_INPUT_BYTES)?;
        }
        Ok(())
    }

    /// Passes on the first `n` bytes of the framed stream (compressed as
    /// one frame when compressing).
    fn emit(&mut self, n: usize) -> Result<(), E> {
        match &mut self.z {
            Some(z) => {
                let frame = z.compress(&self.inner[..n]).expect("zstd compresses in memory");
                (self.sink)(&frame)?;
            }
            None => (self.sink)(&self.inner[..n])?,
        }
        self.inner.drain(..n);
        Ok(())
    }

    /// The rest of the body, the end block, the last frame.
    fn finish(mut self) -> Result<(), E> {
        self.flush_full()?;
        if !self.body.buf.is_empty() {
            frame_block(&mut self.inner, &self.body.buf);
        }
        frame_block(&mut self.inner, &[]);
        while !self.inner.is_empty() {
            self.emit(self.inner.len().min(FRAME_INPUT_BYTES))?;
        }
        Ok(())
    }
}

fn frame_block(out: &mut Vec<u8>, chunk: &[u8]) {
    out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32fast::hash(chunk).to_be_bytes());
    out.extend_from_slice(chunk);
}

/// Encodes a snapshot in pieces to `sink` (see [`Stream`]). Deterministic:
/// the same state and meta give the same bytes.
pub fn encode_to<E>(
    state: &Frozen,
    meta: &SnapshotMeta,
    compress: bool,
    zstd_level: i32,
    sink: &mut dyn FnMut(&[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let z = compress.then(|| {
        let mut z = zstd::bulk::Compressor::new(zstd_level).expect("zstd level is valid");
        z.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
            .expect("zstd accepts the checksum flag");
        z
    });
    let mut inner = Vec::with_capacity(FRAME_INPUT_BYTES + BLOCK_BYTES + 64);
    inner.extend_from_slice(MAGIC);
    inner.push(FORMAT_VERSION);
    inner.extend_from_slice(&crc32fast::hash(&inner[..PROLOGUE_BYTES - 4]).to_be_bytes());
    let mut st = Stream {
        body: Writer {
            buf: Vec::with_capacity(2 * BLOCK_BYTES),
        },
        inner,
        z,
        sink,
    };
    // the body: header, ACL table, nodes, sessions
    let mut acl_ids: BTreeMap<&[Acl], u32> = BTreeMap::new();
    for (_, n) in state.nodes() {
        acl_ids.entry(&n.acl).or_insert(0);
    }
    for (i, v) in acl_ids.values_mut().enumerate() {
        *v = i as u32;
    }
    let w = &mut st.body;
    w.u64(meta.last_index);
    w.u64(meta.last_term);
    w.i64(meta.zxid);
    w.u8(meta.digest.version);
    w.u64(meta.digest.value);
    w.i64(state.next_session_id());
    w.u64(state.node_count() as u64);
    w.u64(state.sessions().len() as u64);
    w.u32(acl_ids.len() as u32);
    for acl in acl_ids.keys() {
        w.u32(acl.len() as u32);
        for a in acl.iter() {
            w.u32(a.perms);
            w.str(&a.id.scheme);
            w.str(&a.id.id);
        }
    }
    for (p, n) in state.nodes() {
        let w = &mut st.body;
        w.str(p);
        w.bytes(&n.data);
        encode_stat(w, &n.stat);
        w.u32(acl_ids[&n.acl[..]]);
        w.i64(n.seq);
        if w.buf.len() >= BLOCK_BYTES {
            st.flush_full()?;
        }
    }
    for (id, s) in state.sessions() {
        let w = &mut st.body;
        w.i64(*id);
        w.i32(s.timeout_ms);
        w.u32(s.auth.len() as u32);
        for a in &s.auth {
            w.str(&a.scheme);
            w.str(&a.id);
        }
        if w.buf.len() >= BLOCK_BYTES {
            st.flush_full()?;
        }
    }
    st.finish()
}

/// Encodes a snapshot of `state` in memory (see [`encode_to`]).
pub fn encode(state: &State, meta: &SnapshotMeta, compress: bool, zstd_level: i32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sink = |b: &[u8]| {
        out.extend_from_slice(b);
        Ok::<(), std::convert::Infallible>(())
    };
    match encode_to(&state.freeze(), meta, compress, zstd_level, &mut sink) {
        Ok(()) => out,
        Err(never) => match never {},
    }
}

// ---- decoding ----

/// Where an inner offset lies in the file: (file offset, inner offset).
struct Frames {
    compressed: bool,
    starts: Vec<(usize, usize)>,
}

impl Frames {
    fn file_offset(&self, inner: usize) -> u64 {
        let i = self.starts.partition_point(|&(s, _)| s <= inner).saturating_sub(1);
        self.starts.get(i).map_or(inner, |&(_, f)| f) as u64
    }

    fn describe(&self, inner: usize, reason: &str) -> String {
        if self.compressed {
            format!("{reason} (byte {inner} of the decompressed stream)")
        } else {
            reason.to_string()
        }
    }
}

fn decompress(file: &str, bytes: &[u8]) -> Result<(Vec<u8>, Frames), SnapshotError> {
    if !bytes.starts_with(&ZSTD_MAGIC) {
        let frames = Frames {
            compressed: false,
            starts: vec![(0, 0)],
        };
        return Ok((bytes.to_vec(), frames));
    }
    let mut out = Vec::new();
    let mut starts = Vec::new();
    let mut pos = 0usize;
    while pos < bytes.len() {
        let corrupt = |reason: String| SnapshotError::Corrupt {
            file: file.to_string(),
            offset: pos as u64,
            reason,
        };
        let size = zstd::zstd_safe::find_frame_compressed_size(&bytes[pos..])
            .map_err(|e| corrupt(format!("bad zstd frame: {}", zstd::zstd_safe::get_error_name(e))))?;
        let frame = zstd::bulk::decompress(&bytes[pos..pos + size], FRAME_INPUT_BYTES)
            .map_err(|e| corrupt(format!("zstd frame does not decompress: {e}")))?;
        starts.push((out.len(), pos));
        out.extend_from_slice(&frame);
        pos += size;
    }
    Ok((
        out,
        Frames {
            compressed: true,
            starts,
        },
    ))
}

/// Checks the blocks and joins their bytes into the body.
fn unframe(file: &str, inner: &[u8], frames: &Frames) -> Result<Vec<u8>, SnapshotError> {
    let corrupt = |at: usize, reason: &str| SnapshotError::Corrupt {
        file: file.to_string(),
        offset: frames.file_offset(at),
        reason: frames.describe(at, reason),
    };
    if inner.len() < PROLOGUE_BYTES || &inner[..MAGIC.len()] != MAGIC {
        return Err(corrupt(0, "not a drift snapshot (bad magic)"));
    }
    let prologue_crc = u32::from_be_bytes(inner[PROLOGUE_BYTES - 4..PROLOGUE_BYTES].try_into().expect("4 bytes"));
    if crc32fast::hash(&inner[..PROLOGUE_BYTES - 4]) != prologue_crc {
        return Err(corrupt(0, "prologue checksum mismatch"));
    }
    let version = inner[MAGIC.len()];
    if version > FORMAT_VERSION {
        return Err(SnapshotError::UnsupportedVersion {
            file: file.to_string(),
            version,
        });
    }
    if version == 0 {
        return Err(corrupt(MAGIC.len(), "format version 0"));
    }
    let mut body = Vec::with_capacity(inner.len());
    let mut pos = PROLOGUE_BYTES;
    loop {
        if inner.len() - pos < 8 {
            return Err(corrupt(pos, "stream ends inside a block header (no end block)"));
        }
        let len = u32::from_be_bytes(inner[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_be_bytes(inner[pos + 4..pos + 8].try_into().expect("4 bytes"));
        if len > BLOCK_BYTES || inner.len() - pos - 8 < len {
            return Err(corrupt(pos, &format!("block length {len} is impossible here")));
        }
        let chunk = &inner[pos + 8..pos + 8 + len];
        if crc32fast::hash(chunk) != crc {
            return Err(corrupt(pos, "block checksum mismatch"));
        }
        body.extend_from_slice(chunk);
        pos += 8 + len;
        if len == 0 {
            break;
        }
    }
    if pos != inner.len() {
        return Err(corrupt(pos, "bytes after the end block"));
    }
    Ok(body)
}

/// Decodes a snapshot file. `digest_on` says whether the loading replica
/// keeps digests (node digests are recomputed either way to verify).
pub fn decode(file: &str, bytes: &[u8], digest_on: bool) -> Result<(State, SnapshotMeta), SnapshotError> {
    let (inner, frames) = decompress(file, bytes)?;
    let body = unframe(file, &inner, &frames)?;
    let (state, meta, computed) = decode_body(&body, digest_on).map_err(|e| {
        // body offset → offset in the inner stream (all blocks but the last are full)
        let b = e.offset;
        let inner = PROLOGUE_BYTES + (b / BLOCK_BYTES) * (8 + BLOCK_BYTES) + 8 + b % BLOCK_BYTES;
        SnapshotError::Corrupt {
            file: file.to_string(),
            offset: frames.file_offset(inner),
            reason: frames.describe(inner, &format!("body: {}", e.reason)),
        }
    })?;
    if meta.digest.version == DIGEST_VERSION && digest::tree_value(computed) != meta.digest.value {
        return Err(SnapshotError::DigestMismatch {
            file: file.to_string(),
            stored: meta.digest,
            computed: digest::tree_value(computed),
        });
    }
    Ok((state, meta))
}

/// The state, its meta, and the recomputed digest sum.
fn decode_body(body: &[u8], digest_on: bool) -> Result<(State, SnapshotMeta, u64), DecodeError> {
    let mut r = Reader::new(body);
    let last_index = r.u64()?;
    let last_term = r.u64()?;
    let zxid = r.i64()?;
    let digest_version = r.u8()?;
    let digest_value = r.u64()?;
    let next_session_id = r.i64()?;
    let node_count = r.u64()? as usize;
    let session_count = r.u64()? as usize;
    let acl_count = r.count(ITEMS_MAX, 4)?;
    if node_count > ITEMS_MAX || session_count > ITEMS_MAX {
        return r.error("impossible node or session count");
    }
    let mut acls: Vec<Arc<[Acl]>> = Vec::with_capacity(acl_count);
    for _ in 0..acl_count {
        acls.push(decode_acl(&mut r)?.into());
    }
    let mut nodes: BTreeMap<Arc<str>, Arc<Node>> = BTreeMap::new();
    let mut children: BTreeMap<String, i32> = BTreeMap::new();
    let mut sum = 0u64;
    let mut previous: Option<Arc<str>> = None;
    for _ in 0..node_count {
        let p = r.str(PATH_BYTES_MAX)?.to_string();
        if path::validate(&p).is_err() {
            return r.error(format!("invalid path {p:?}"));
        }
        if previous.as_deref().is_some_and(|q| q >= p.as_str()) {
            return r.error(format!("node {p:?} out of path order"));
        }
        if previous.is_none() && p != "/" {
            return r.error("the first node is not /");
        }
        let data: Arc<[u8]> = Arc::from(r.bytes(DATA_BYTES_MAX)?);
        let stat = decode_stat(&mut r)?;
        let acl_id = r.u32()? as usize;
        let seq = r.i64()?;
        if stat.data_length as usize != data.len() {
            return r.error(format!(
                "{p}: data length {} but {} bytes",
                stat.data_length,
                data.len()
            ));
        }
        let Some(acl) = acls.get(acl_id).cloned() else {
            return r.error(format!("{p}: ACL id {acl_id} not in the table"));
        };
        if p != "/" {
            let parent = path::parent(&p);
            if !nodes.contains_key(parent) {
                return r.error(format!("{p}: parent missing"));
            }
            *children.entry(parent.to_string()).or_default() += 1;
        }
        let content = digest::content_hash(&p, &data);
        let d = digest::digest_from_content(content, &stat, seq);
        sum = sum.wrapping_add(d);
        let node = Node {
            data,
            stat,
            acl,
            seq,
            content: if digest_on { content } else { 0 },
            digest: if digest_on { d } else { 0 },
        };
        let key: Arc<str> = Arc::from(p);
        previous = Some(key.clone());
        nodes.insert(key, Arc::new(node));
    }
    let mut sessions = BTreeMap::new();
    for _ in 0..session_count {
        let id = r.i64()?;
        let timeout_ms = r.i32()?;
        let n = r.count(crate::acl::ACL_ENTRIES_MAX, 8)?;
        let mut auth = Vec::with_capacity(n);
        for _ in 0..n {
            let scheme = r.str(crate::acl::ACL_ID_BYTES_MAX)?.to_string();
            let id = r.str(crate::acl::ACL_ID_BYTES_MAX)?.to_string();
            auth.push(crate::acl::Id { scheme, id });
        }
        if sessions.insert(id, Session { timeout_ms, auth }).is_some() {
            return r.error(format!("session {id} twice"));
        }
    }
    r.finish()?;
    for (p, n) in &nodes {
        let have = children.get(&**p).copied().unwrap_or(0);
        if n.stat.num_children != have {
            return r.error(format!("{p}: num_children {} but {have} children", n.stat.num_children));
        }
        if let Kind::Ephemeral { owner } = n.kind() {
            if !sessions.contains_key(&owner) {
                return r.error(format!("{p}: ephemeral of unknown session {owner}"));
            }
        }
    }
    let meta = SnapshotMeta {
        last_index,
        last_term,
        zxid,
        digest: Digest {
            version: digest_version,
            value: if digest_version == NO_DIGEST { 0 } else { digest_value },
        },
    };
    let state = State::from_parts(nodes, sessions, next_session_id, zxid, digest_on);
    Ok((state, meta, sum))
}

// ---- files ----

#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub snapshots_to_keep: usize,
    pub compress: bool,
    pub zstd_level: i32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            snapshots_to_keep: 3,
            compress: true,
            zstd_level: 3,
        }
    }
}

fn io_err(file: &str) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
    move |error| SnapshotError::Io {
        file: file.to_string(),
        error,
    }
}

/// The snapshot files of one data directory.
pub struct Snapshots {
    pub config: Config,
}

impl Snapshots {
    pub fn new(config: Config) -> Snapshots {
        assert!(config.snapshots_to_keep >= 1, "keep at least one snapshot");
        Snapshots { config }
    }

    /// Removes every `tmp_` file (a write a crash interrupted); returns
    /// the names removed. Run at start-up, before loading.
    pub fn clean_incomplete(&self, disk: &mut dyn Disk) -> Result<Vec<String>, SnapshotError> {
        let names = disk.list().map_err(io_err("(directory)"))?;
        let mut removed = Vec::new();
        for tmp in names.iter().filter(|n| n.starts_with(TMP_PREFIX)) {
            disk.remove(tmp).map_err(io_err(tmp))?;
            removed.push(tmp.clone());
        }
        Ok(removed)
    }

    /// Snapshot files, oldest first, as (last index, last term, name).
    pub fn list(&self, disk: &dyn Disk) -> Result<Vec<(u64, u64, String)>, SnapshotError> {
        let mut out: Vec<(u64, u64, String)> = disk
            .list()
            .map_err(io_err("(directory)"))?
            .into_iter()
            .filter_map(|n| parse_name(&n).map(|(i, t)| (i, t, n)))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Writes a snapshot of `state` (see [`State::freeze`]) durably, then
    /// prunes old ones: its name and size. The file is written as it is
    /// encoded, a few MiB at a time, under a temporary name that is synced
    /// and renamed into place.
    pub fn write(
        &self,
        disk: &mut dyn Disk,
        state: &Frozen,
        meta: &SnapshotMeta,
    ) -> Result<(String, u64), SnapshotError> {
        let name = file_name(meta.last_index, meta.last_term);
        let tmp = format!("{TMP_PREFIX}{name}");
        disk.write(&tmp, &[]).map_err(io_err(&tmp))?;
        let mut pending: Vec<u8> = Vec::with_capacity(WRITE_BYTES + FRAME_INPUT_BYTES);
        let mut size = 0u64;
        let mut sink = |b: &[u8]| -> std::io::Result<()> {
            pending.extend_from_slice(b);
            size += b.len() as u64;
            if pending.len() >= WRITE_BYTES {
                disk.append(&tmp, &pending)?;
                pending.clear();
            }
            Ok(())
        };
        encode_to(state, meta, self.config.compress, self.config.zstd_level, &mut sink).map_err(io_err(&tmp))?;
        if !pending.is_empty() {
            disk.append(&tmp, &pending).map_err(io_err(&tmp))?;
        }
        self.put_in_place(disk, &tmp, &name)?;
        Ok((name, size))
    }

    /// Stores an encoded snapshot (one received from a leader, say) as
    /// `name`: written and synced under a temporary name, then renamed, so
    /// a crash leaves either the old file or the new one (start-up removes
    /// the temporary); then prunes old snapshots.
    pub fn write_bytes(&self, disk: &mut dyn Disk, name: &str, bytes: &[u8]) -> Result<(), SnapshotError> {
        let tmp = format!("{TMP_PREFIX}{name}");
        disk.write(&tmp, bytes).map_err(io_err(&tmp))?;
        self.put_in_place(disk, &tmp, name)
    }

    /// Syncs the written `tmp`, renames it to `name`, prunes old snapshots.
    fn put_in_place(&self, disk: &mut dyn Disk, tmp: &str, name: &str) -> Result<(), SnapshotError> {
        disk.sync(tmp).map_err(io_err(tmp))?;
        disk.rename(tmp, name).map_err(io_err(name))?;
        let all = self.list(disk)?;
        let excess = all.len().saturating_sub(self.config.snapshots_to_keep);
        for (_, _, old) in all.into_iter().take(excess) {
            disk.remove(&old).map_err(io_err(&old))?;
        }
        Ok(())
    }

    pub fn load(&self, disk: &dyn Disk, name: &str, digest_on: bool) -> Result<(State, SnapshotMeta), SnapshotError> {
        let bytes = disk.read(name).map_err(io_err(name))?;
        decode(name, &bytes, digest_on)
    }

    /// The newest snapshot, if any.
    pub fn load_latest(
        &self,
        disk: &dyn Disk,
        digest_on: bool,
    ) -> Result<Option<(State, SnapshotMeta, String)>, SnapshotError> {
        let Some((_, _, name)) = self.list(disk)?.pop() else {
            return Ok(None);
        };
        let (state, meta) = self.load(disk, &name, digest_on)?;
        Ok(Some((state, meta, name)))
    }
}
