//! The changelog: Raft's log on disk, as ClickHouse Keeper keeps it.
//!
//! Segment files are named by the index of their first record,
//! `changelog_<first:020>.bin`; a new segment starts every
//! `rotate_interval` entries. A record is
//! `magic u32 | len u32 | crc32 u32 | payload` with the CRC over the
//! payload, which is `index u64, term u64, kind u8, data` compressed with
//! zstd (magic `D71F7C0A`) or, for a record under [`COMPRESS_FROM_BYTES`]
//! or one zstd does not shrink, stored as it is (magic `D71F7C0B`): most
//! entries are under a few KiB, where compressing each one alone saves
//! little disk and costs a fifth of a simulated keeper's CPU.
//!
//! Guarantees: [`Changelog::append`] returns only after every touched
//! segment is synced, so an acknowledged entry survives a crash;
//! [`Changelog::append_unsynced`] leaves the last segment's sync to its
//! caller, who acknowledges nothing it wrote until that sync is done. On open,
//! a torn or corrupt tail of the last segment (what a crash mid-append
//! leaves) is truncated to the last good record and reported; corruption
//! anywhere else — an earlier segment, or a bad record followed by good
//! ones — refuses to load, naming the file and offset, because truncating
//! there would drop entries this replica acknowledged.
//!
//! Room: the last segment is given room ahead of its end
//! ([`Config::reserve_bytes`] at a time, through [`Disk::reserve`]), so a
//! sync after an append has no block allocation of the file to write.
//! A crash can leave the room as zeros after the last record (in an
//! earlier segment too: the disk cuts a file's room off when it moves on
//! to the next file, not durably): open takes a zero tail
//! (in any segment) for the segment's end, cuts it off, and reports
//! nothing torn. A power loss may also leave unsynced pages written in
//! any order, so in the last segment a bad record followed by a good one
//! is a torn tail, not damage, when a whole block of zeros (room no
//! write reached) lies between them.
//!
//! Memory: every retained record's term and place on disk stay in memory
//! (24 bytes each); its bytes only while it is among the newest records
//! that fit in [`Config::cache_bytes`]. An older one is read back from
//! its segment when asked for (a follower far behind, a restart's
//! replay), so what the log holds in memory is bounded by configuration,
//! not by how large the entries between two snapshots were.
//!
//! An I/O error from a mutating call leaves the files in an unknown state:
//! the caller must stop and re-open (the driver aborts the process).

use crate::disk::Disk;
use std::borrow::Cow;
use std::collections::VecDeque;

pub const PREFIX: &str = "changelog_";
const SUFFIX: &str = ".bin";
const MAGIC: u32 = 0xD71F_7C0A;
/// A record whose payload is stored uncompressed.
const MAGIC_RAW: u32 = 0xD71F_7C0B;
/// Records whose plain payload is shorter than this are stored raw.
pub const COMPRESS_FROM_BYTES: usize = 4096;
const HEADER_BYTES: usize = 12;
/// Largest entry payload accepted: a ZooKeeper packet is at most 1 MiB,
/// and an entry is one request plus a small header.
pub const ENTRY_DATA_BYTES_MAX: usize = 4 << 20;
/// Largest compressed record accepted when reading.
const RECORD_BYTES_MAX: usize = ENTRY_DATA_BYTES_MAX + (64 << 10);

/// One Raft log entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub index: u64,
    pub term: u64,
    /// Raft's entry type (normal, configuration change, …).
    pub kind: u8,
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Entries per segment file.
    pub rotate_interval: u64,
    /// Entries kept below a snapshot when compacting.
    pub reserved_log_items: u64,
    pub zstd_level: i32,
    /// Bytes of the newest records kept in memory (at least the newest
    /// record is); older ones are read from disk when asked for.
    pub cache_bytes: usize,
    /// Room reserved ahead of the last segment's end, this much at a time
    /// ([`Disk::reserve`]: a sync after an append into reserved room has
    /// no block allocation to write); 0 reserves none.
    pub reserve_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rotate_interval: 100_000,
            reserved_log_items: 100_000,
            zstd_level: 1,
            cache_bytes: CACHE_BYTES_DEFAULT,
            reserve_bytes: RESERVE_BYTES_DEFAULT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChangelogError {
    #[error("changelog {file}: {error}")]
    Io {
        file: String,
        #[source]
        error: std::io::Error,
    },
    /// Damage that cannot be a torn tail.
    #[error("changelog {file} is corrupt at offset {offset}: {reason}")]
    Corrupt { file: String, offset: u64, reason: String },
    /// A caller error: a gap, an overwrite below the start, an oversized entry.
    #[error("changelog: {0}")]
    Invalid(String),
}

/// A torn tail found and cut off at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub file: String,
    pub offset: u64,
    pub bytes_dropped: u64,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub torn_tail: Option<TornTail>,
    pub segments: usize,
    pub records: u64,
}

/// [`Config::cache_bytes`] unless configured.
pub const CACHE_BYTES_DEFAULT: usize = 32 << 20;
/// [`Config::reserve_bytes`] unless configured: the zeros one reserve
/// writes are flushed by the next sync, so a larger step makes that one
/// sync slow (4 MiB: syncs of 15–26 ms on the machine measured, where
/// 1 MiB stays under the appends' own worst).
pub const RESERVE_BYTES_DEFAULT: u64 = 1 << 20;

/// Where a retained record is, and its term.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// First index of its segment.
    segment: u64,
    offset: u64,
    term: u64,
}

#[derive(Debug, Clone)]
struct Segment {
    name: String,
    first: u64,
    len: u64,
}

pub struct Changelog {
    config: Config,
    compressor: zstd::bulk::Compressor<'static>,
    segments: Vec<Segment>,
    /// Each retained record's place and term, indices `start..next`.
    places: VecDeque<Place>,
    /// The newest retained records, indices `next - cache.len()..next`.
    cache: VecDeque<LogRecord>,
    /// Bytes of data in `cache`.
    cached: usize,
    start: u64,
    next: u64,
}

fn io_err(file: &str) -> impl FnOnce(std::io::Error) -> ChangelogError + '_ {
    move |error| ChangelogError::Io {
        file: file.to_string(),
        error,
    }
}

/// Syncs the segment [`Changelog::append_unsynced`] left unsynced, from
/// any handle on the same directory. A segment gone meanwhile has nothing
/// left to make durable: the log removes its last segment only when a
/// conflicting suffix is cut away or a snapshot from the leader replaces
/// the whole log, and what replaced it was made durable then.
pub fn sync_left(disk: &mut dyn Disk, name: &str) -> Result<(), ChangelogError> {
    match disk.sync(name) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other.map_err(io_err(name)),
    }
}

pub fn segment_name(first: u64) -> String {
    format!("{PREFIX}{first:020}{SUFFIX}")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?.parse().ok()
}

/// Encodes one record: header (magic, length, CRC32) and zstd payload.
pub fn encode_record(r: &LogRecord, level: i32) -> Vec<u8> {
    let mut z = zstd::bulk::Compressor::new(level).expect("zstd level is valid");
    encode_record_with(&mut z, r)
}

/// [`encode_record`] with a reused compression context (a fresh context
/// per record costs more than compressing a small record).
fn encode_record_with(z: &mut zstd::bulk::Compressor<'static>, r: &LogRecord) -> Vec<u8> {
    // the plain payload written in place after room for the header: a raw
    // record (most of them) is then never copied
    let mut out = Vec::with_capacity(HEADER_BYTES + 17 + r.data.len());
    out.extend_from_slice(&[0; HEADER_BYTES]);
    out.extend_from_slice(&r.index.to_be_bytes());
    out.extend_from_slice(&r.term.to_be_bytes());
    out.push(r.kind);
    out.extend_from_slice(&r.data);
    let plain_len = out.len() - HEADER_BYTES;
    let compressed = (plain_len >= COMPRESS_FROM_BYTES)
        .then(|| z.compress(&out[HEADER_BYTES..]).expect("zstd compresses in memory"))
        .filter(|c| c.len() < plain_len);
    let magic = match compressed {
        Some(c) => {
            out.truncate(HEADER_BYTES);
            out.extend_from_slice(&c);
            MAGIC
        }
        None => MAGIC_RAW,
    };
    let payload_len = out.len() - HEADER_BYTES;
    let crc = crc32fast::hash(&out[HEADER_BYTES..]);
    out[0..4].copy_from_slice(&magic.to_be_bytes());
    out[4..8].copy_from_slice(&(payload_len as u32).to_be_bytes());
    out[8..12].copy_from_slice(&crc.to_be_bytes());
    out
}

/// Decodes the record at `at` (with a reused decompression context): the
/// record and its size, or why not.
fn decode_record_with(
    z: &mut zstd::bulk::Decompressor<'static>,
    bytes: &[u8],
    at: usize,
) -> Result<(LogRecord, usize), String> {
    let rest = &bytes[at..];
    if rest.len() < HEADER_BYTES {
        return Err(format!("{} bytes: shorter than a record header", rest.len()));
    }
    let word = |i: usize| u32::from_be_bytes(rest[i..i + 4].try_into().expect("4 bytes"));
    let raw = match word(0) {
        MAGIC => false,
        MAGIC_RAW => true,
        _ => return Err("no record magic".into()),
    };
    let len = word(4) as usize;
    if len > RECORD_BYTES_MAX {
        return Err(format!("record length {len} exceeds the limit"));
    }
    if rest.len() < HEADER_BYTES + len {
        return Err(format!(
            "record of {len} bytes cut short at {}",
            rest.len() - HEADER_BYTES
        ));
    }
    let payload = &rest[HEADER_BYTES..HEADER_BYTES + len];
    if crc32fast::hash(payload) != word(8) {
        return Err("checksum mismatch".into());
    }
    let unpacked;
    let plain: &[u8] = if raw {
        payload
    } else {
        unpacked = z
            .decompress(payload, ENTRY_DATA_BYTES_MAX + 17)
            .map_err(|e| format!("payload does not decompress: {e}"))?;
        &unpacked
    };
    if plain.len() < 17 {
        return Err("payload shorter than a record".into());
    }
    let index = u64::from_be_bytes(plain[0..8].try_into().expect("8 bytes"));
    let term = u64::from_be_bytes(plain[8..16].try_into().expect("8 bytes"));
    Ok((
        LogRecord {
            index,
            term,
            kind: plain[16],
            data: plain[17..].to_vec(),
        },
        HEADER_BYTES + len,
    ))
}

impl Changelog {
    /// Opens the changelog on `disk`, repairing a torn tail.
    pub fn open(disk: &mut dyn Disk, config: Config) -> Result<(Changelog, LoadReport), ChangelogError> {
        assert!(config.rotate_interval > 0, "rotate_interval must be positive");
        let names = disk.list().map_err(io_err("(directory)"))?;
        let mut firsts: Vec<(u64, String)> = names
            .into_iter()
            .filter_map(|n| parse_segment_name(&n).map(|f| (f, n)))
            .collect();
        firsts.sort();
        let mut log = Changelog {
            config,
            compressor: zstd::bulk::Compressor::new(config.zstd_level)
                .map_err(|e| ChangelogError::Invalid(format!("zstd level {}: {e}", config.zstd_level)))?,
            segments: Vec::new(),
            places: VecDeque::new(),
            cache: VecDeque::new(),
            cached: 0,
            start: 1,
            next: 1,
        };
        let mut report = LoadReport::default();
        let mut unzstd = zstd::bulk::Decompressor::new().map_err(|e| ChangelogError::Invalid(e.to_string()))?;
        let count = firsts.len();
        for (k, (first, name)) in firsts.into_iter().enumerate() {
            let last_segment = k + 1 == count;
            let bytes = disk.read(&name).map_err(io_err(&name))?;
            if k == 0 {
                log.start = first;
                log.next = first;
            } else if first != log.next {
                return Err(ChangelogError::Corrupt {
                    file: name,
                    offset: 0,
                    reason: format!("segment starts at index {first}, expected {}", log.next),
                });
            }
            let mut offset = 0usize;
            while offset < bytes.len() {
                let parsed = decode_record_with(&mut unzstd, &bytes, offset).and_then(|(r, size)| {
                    if r.index == log.next {
                        Ok((r, size))
                    } else {
                        Err(format!("record index {} where {} was expected", r.index, log.next))
                    }
                });
                match parsed {
                    Ok((r, size)) => {
                        log.places.push_back(Place {
                            segment: first,
                            offset: offset as u64,
                            term: r.term,
                        });
                        log.cache_push(r);
                        log.next += 1;
                        offset += size;
                    }
                    Err(_) if bytes[offset..].iter().all(|&b| b == 0) => {
                        // room reserved past the last record, left by a
                        // crash: the segment's end, not damage
                        disk.truncate(&name, offset as u64).map_err(io_err(&name))?;
                        disk.sync(&name).map_err(io_err(&name))?;
                        break;
                    }
                    Err(reason) => {
                        let later = valid_record_after(&mut unzstd, &bytes, offset + 1, log.next);
                        // a later record is damage, unless a block of room
                        // never written over lies before it: after a power
                        // loss the unsynced pages of room may reach the disk
                        // in any order, not only as a prefix
                        let unwritten = later.is_some_and(|at| lost_page_within(&bytes, offset, at));
                        if !last_segment || (later.is_some() && !unwritten) {
                            return Err(ChangelogError::Corrupt {
                                file: name,
                                offset: offset as u64,
                                reason,
                            });
                        }
                        disk.truncate(&name, offset as u64).map_err(io_err(&name))?;
                        disk.sync(&name).map_err(io_err(&name))?;
                        report.torn_tail = Some(TornTail {
                            file: name.clone(),
                            offset: offset as u64,
                            bytes_dropped: (bytes.len() - offset) as u64,
                            reason,
                        });
                        break;
                    }
                }
            }
            let len = (offset as u64).min(bytes.len() as u64);
            log.segments.push(Segment { name, first, len });
        }
        report.segments = log.segments.len();
        report.records = log.places.len() as u64;
        Ok((log, report))
    }

    /// Index of the first retained record (= `next_index` when empty).
    pub fn start_index(&self) -> u64 {
        self.start
    }

    /// The index the next appended record must have.
    pub fn next_index(&self) -> u64 {
        self.next
    }

    pub fn last_index(&self) -> Option<u64> {
        (self.next > self.start).then(|| self.next - 1)
    }

    /// The term of retained record `index`.
    pub fn term(&self, index: u64) -> Option<u64> {
        let k = index.checked_sub(self.start)?;
        (index < self.next).then(|| self.places[k as usize].term)
    }

    /// Retained record `index`: from memory if it is among the newest
    /// cached, else read back from its segment on `disk`.
    pub fn get(&self, disk: &dyn Disk, index: u64) -> Result<Option<Cow<'_, LogRecord>>, ChangelogError> {
        if index < self.start || index >= self.next {
            return Ok(None);
        }
        let cached_from = self.next - self.cache.len() as u64;
        if index >= cached_from {
            return Ok(Some(Cow::Borrowed(&self.cache[(index - cached_from) as usize])));
        }
        let k = (index - self.start) as usize;
        let place = self.places[k];
        let seg = self
            .segments
            .iter()
            .find(|s| s.first == place.segment)
            .expect("a retained record's segment is retained");
        let end = match self.places.get(k + 1) {
            Some(p) if p.segment == place.segment => p.offset,
            _ => seg.len,
        };
        let bytes = disk
            .read_at(&seg.name, place.offset, (end - place.offset) as usize)
            .map_err(io_err(&seg.name))?;
        let corrupt = |reason: String| ChangelogError::Corrupt {
            file: seg.name.clone(),
            offset: place.offset,
            reason,
        };
        let mut z = zstd::bulk::Decompressor::new().map_err(|e| ChangelogError::Invalid(e.to_string()))?;
        let (r, _) = decode_record_with(&mut z, &bytes, 0).map_err(corrupt)?;
        if r.index != index {
            return Err(corrupt(format!("record index {} read back where {index} was", r.index)));
        }
        Ok(Some(Cow::Owned(r)))
    }

    /// Retained records `lo..hi` (clamped to what is retained), read as
    /// [`Changelog::get`] reads each.
    pub fn read_range(&self, disk: &dyn Disk, lo: u64, hi: u64) -> Result<Vec<LogRecord>, ChangelogError> {
        let (lo, hi) = (lo.max(self.start), hi.min(self.next));
        let mut out = Vec::with_capacity(hi.saturating_sub(lo) as usize);
        for i in lo..hi {
            out.extend(self.get(disk, i)?.map(Cow::into_owned));
        }
        Ok(out)
    }

    /// Bytes of record data held in memory (at most
    /// [`Config::cache_bytes`], or the newest record alone).
    pub fn cached_bytes(&self) -> usize {
        self.cached
    }

    /// Caches `r` as the newest record, dropping the oldest cached ones
    /// beyond the budget.
    fn cache_push(&mut self, r: LogRecord) {
        self.cached += r.data.len();
        self.cache.push_back(r);
        while self.cached > self.config.cache_bytes && self.cache.len() > 1 {
            let old = self.cache.pop_front().expect("more than one cached");
            self.cached -= old.data.len();
        }
    }

    /// The segment appended to last.
    pub fn last_segment(&self) -> Option<&str> {
        self.segments.last().map(|s| s.name.as_str())
    }

    /// The bytes the last segment holds, as written (synced or not).
    pub fn tail_len(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.len)
    }

    pub fn segment_names(&self) -> Vec<String> {
        self.segments.iter().map(|s| s.name.clone()).collect()
    }

    /// Appends contiguous records, first overwriting any retained records
    /// from `records[0].index` on (Raft replacing a conflicting suffix).
    /// Returns after every touched segment is synced: one sync per file
    /// per batch.
    pub fn append(&mut self, disk: &mut dyn Disk, records: &[LogRecord]) -> Result<(), ChangelogError> {
        if let Some(name) = self.append_unsynced(disk, records)? {
            disk.sync(&name).map_err(io_err(&name))?;
        }
        Ok(())
    }

    /// [`Changelog::append`] without the last sync: returns the segment
    /// whose new tail is written but not yet synced, for the caller to
    /// sync (it may do so on another thread: a sync of the file covers
    /// every write made before it). Only that segment, the last, can hold
    /// unsynced bytes afterwards: a segment rotated away from, and a cut
    /// of a conflicting suffix, are synced before this returns, so
    /// start-up still finds a torn tail only at the end of the last
    /// segment.
    pub fn append_unsynced(
        &mut self,
        disk: &mut dyn Disk,
        records: &[LogRecord],
    ) -> Result<Option<String>, ChangelogError> {
        let Some(first) = records.first() else {
            return Ok(None);
        };
        for w in records.windows(2) {
            if w[1].index != w[0].index + 1 {
                return Err(ChangelogError::Invalid(format!(
                    "batch not contiguous: {} then {}",
                    w[0].index, w[1].index
                )));
            }
        }
        if records.iter().any(|r| r.data.len() > ENTRY_DATA_BYTES_MAX) {
            return Err(ChangelogError::Invalid("entry larger than ENTRY_DATA_BYTES_MAX".into()));
        }
        if self.places.is_empty() && self.segments.is_empty() {
            self.start = first.index;
            self.next = first.index;
        }
        if first.index < self.next {
            self.truncate_from(disk, first.index)?;
        }
        if first.index != self.next {
            return Err(ChangelogError::Invalid(format!(
                "append at {} leaves a gap after {}",
                first.index, self.next
            )));
        }
        // One write per segment touched, then one sync per segment. A
        // segment that is finished (rotated away from) is synced before
        // anything goes to the next one: start-up treats only the last
        // segment's tail as possibly torn.
        let mut touched: Vec<String> = Vec::new();
        let mut pending: Vec<u8> = Vec::new();
        for r in records {
            let rotate = match self.segments.last() {
                None => true,
                Some(s) => r.index - s.first >= self.config.rotate_interval,
            };
            if rotate {
                if let Some(seg) = self.segments.last() {
                    if !pending.is_empty() {
                        disk.append(&seg.name, &pending).map_err(io_err(&seg.name))?;
                        pending.clear();
                    }
                    // synced even if this batch did not touch it: an
                    // earlier append may have left its sync to the caller
                    disk.sync(&seg.name).map_err(io_err(&seg.name))?;
                    if touched.last() == Some(&seg.name) {
                        touched.pop();
                    }
                }
                self.segments.push(Segment {
                    name: segment_name(r.index),
                    first: r.index,
                    len: 0,
                });
            }
            let seg = self.segments.last_mut().expect("a segment exists");
            let bytes = encode_record_with(&mut self.compressor, r);
            self.places.push_back(Place {
                segment: seg.first,
                offset: seg.len,
                term: r.term,
            });
            seg.len += bytes.len() as u64;
            pending.extend_from_slice(&bytes);
            if touched.last() != Some(&seg.name) {
                touched.push(seg.name.clone());
            }
            self.cache_push(r.clone());
            self.next += 1;
        }
        let step = self.config.reserve_bytes;
        if let Some(seg) = self.segments.last() {
            // room up to the next multiple of the step past the end (the
            // disk writes only what it does not have yet; a step of 0
            // asks for none); only a saving: without it (a full disk
            // refusing the zeros) the append below grows the file as
            // before
            if let Some(steps) = seg.len.checked_div(step) {
                let _ = disk.reserve(&seg.name, (steps + 1) * step);
            }
            if !pending.is_empty() {
                disk.append(&seg.name, &pending).map_err(io_err(&seg.name))?;
            }
        }
        // every segment but the last was synced as it was left
        debug_assert!(touched.len() <= 1);
        Ok(touched.pop())
    }

    /// Removes retained records with index >= `index`.
    pub fn truncate_from(&mut self, disk: &mut dyn Disk, index: u64) -> Result<(), ChangelogError> {
        if index >= self.next {
            return Ok(());
        }
        if index < self.start {
            return Err(ChangelogError::Invalid(format!(
                "cannot truncate at {index}: records start at {}",
                self.start
            )));
        }
        let Place {
            segment: seg_first,
            offset,
            ..
        } = self.places[(index - self.start) as usize];
        while let Some(last) = self.segments.last() {
            if last.first > seg_first {
                disk.remove(&last.name).map_err(io_err(&last.name))?;
                self.segments.pop();
            } else {
                break;
            }
        }
        let seg = self.segments.last_mut().expect("the record's segment exists");
        disk.truncate(&seg.name, offset).map_err(io_err(&seg.name))?;
        disk.sync(&seg.name).map_err(io_err(&seg.name))?;
        seg.len = offset;
        self.places.truncate((index - self.start) as usize);
        let dropped = (self.next - index) as usize;
        for _ in 0..dropped.min(self.cache.len()) {
            let r = self.cache.pop_back().expect("counted");
            self.cached -= r.data.len();
        }
        self.next = index;
        Ok(())
    }

    /// Drops whole segments below a snapshot at `snapshot_index`, keeping
    /// at least `reserved_log_items` records before it and never the
    /// segment being appended to.
    pub fn compact(&mut self, disk: &mut dyn Disk, snapshot_index: u64) -> Result<usize, ChangelogError> {
        let keep_from = (snapshot_index + 1).saturating_sub(self.config.reserved_log_items);
        let mut removed = 0;
        while self.segments.len() > 1 {
            let next_first = self.segments[1].first;
            if next_first > keep_from {
                break;
            }
            let seg = self.segments.remove(0);
            disk.remove(&seg.name).map_err(io_err(&seg.name))?;
            self.places.drain(..(next_first - self.start) as usize);
            self.start = next_first;
            while self.next - (self.cache.len() as u64) < self.start {
                let r = self.cache.pop_front().expect("a cached record below the start");
                self.cached -= r.data.len();
            }
            removed += 1;
        }
        Ok(removed)
    }

    /// Drops everything and restarts the log at `next_index` (after a
    /// snapshot from the leader replaced the state).
    pub fn reset(&mut self, disk: &mut dyn Disk, next_index: u64) -> Result<(), ChangelogError> {
        for s in self.segments.drain(..) {
            disk.remove(&s.name).map_err(io_err(&s.name))?;
        }
        self.places.clear();
        self.cache.clear();
        self.cached = 0;
        self.start = next_index;
        self.next = next_index;
        Ok(())
    }
}

/// Where the first well-formed record of a later index than `next` (the
/// one that failed) starts at or after `from`, if one does: then the
/// damage is not a torn tail. A record-shaped run of bytes inside an
/// entry's data (a raw record, or incompressible data zstd keeps
/// verbatim) rarely carries such an index.
fn valid_record_after(
    z: &mut zstd::bulk::Decompressor<'static>,
    bytes: &[u8],
    from: usize,
    next: u64,
) -> Option<usize> {
    let magics = [MAGIC.to_be_bytes(), MAGIC_RAW.to_be_bytes()];
    (from..bytes.len().saturating_sub(HEADER_BYTES - 1))
        .filter(|&i| magics.iter().any(|m| bytes[i..i + 4] == *m))
        .find(|&i| decode_record_with(z, bytes, i).is_ok_and(|(r, _)| r.index > next))
}

/// The file system's block: reserved room the writes never reached is
/// whole blocks of zeros.
const BLOCK_BYTES: usize = 4096;

/// Whether a page of the log's room that a power loss did not write lies
/// between a failed record at `from` and the valid record at `to`: an
/// aligned block of [`BLOCK_BYTES`] ending after `from` and by `to`
/// whose bytes from `from` on are all zeros. The unsynced pages of room
/// may reach the disk in any order, and the first of them may also hold
/// the last synced bytes (written again with what followed), so its
/// zeros start at the failed record. No damage reads so: every record
/// starts with its non-zero magic, a payload stored raw because it is
/// shorter than [`COMPRESS_FROM_BYTES`] cannot hold a block of zeros, a
/// longer one that did would have shrunk and been stored compressed, and
/// zstd's output codes a run of zeros instead of holding it.
fn lost_page_within(bytes: &[u8], from: usize, to: usize) -> bool {
    let to = to.min(bytes.len());
    (from / BLOCK_BYTES + 1..)
        .map(|k| k * BLOCK_BYTES)
        .take_while(|&end| end <= to)
        .any(|end| bytes[from.max(end - BLOCK_BYTES)..end].iter().all(|&x| x == 0))
}
