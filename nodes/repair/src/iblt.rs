//! An invertible Bloom lookup table over 32-bit entry fingerprints: the
//! set-reconciliation path of a repair session.
//!
//! Each side inserts the fingerprint of every entry of the range; one
//! side's table minus the other's holds only the fingerprints on one side
//! alone (the shared ones cancel), and peeling pure cells lists them —
//! with their side — as long as the table has about 1.3 cells per
//! difference or more. A table's size depends on the difference, not on
//! the range: that is why a few differences among millions of entries cost
//! a few hundred bytes.
//!
//! A cell is a count (mod 256), the XOR of the fingerprints and the XOR
//! of a 16-bit check of each: a cell is *pure* when its count is ±1 and
//! its check matches its fingerprint. The three cells of a fingerprint lie
//! one in each third of the table, so they never coincide.
//!
//! Invariant: `decode(t_a − t_b)` returns exactly A∖B and B∖A whenever it
//! succeeds and no two of the fingerprints involved collide (tested); a
//! failure is reported, never a wrong answer, except for a false pure cell
//! (probability 2^-16 per peel), which a caller treats like any other
//! missed difference: the next session, with another seed, finds it.

/// Bytes of one cell on the wire: count, fingerprint, check.
pub const CELL_BYTES: usize = 7;
/// Most cells a table may have (the path beyond it is the Merkle walk).
pub const CELLS_MAX: usize = 1 << 22;
const HASHES: usize = 3;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Cell {
    count: i8,
    fp: u32,
    check: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iblt {
    seed: u64,
    cells: Vec<Cell>,
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Iblt {
    /// An empty table of at least `cells` cells (a multiple of 3, at least 3).
    pub fn new(seed: u64, cells: usize) -> Iblt {
        let n = cells.clamp(HASHES, CELLS_MAX).div_ceil(HASHES) * HASHES;
        Iblt {
            seed,
            cells: vec![Cell::default(); n],
        }
    }

    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    fn check(&self, fp: u32) -> u16 {
        (mix(fp as u64 ^ self.seed.rotate_left(17)) >> 48) as u16
    }

    fn positions(&self, fp: u32) -> [usize; HASHES] {
        let third = (self.cells.len() / HASHES) as u64;
        let h = mix(fp as u64 ^ self.seed);
        let h2 = mix(h);
        [
            (h % third) as usize,
            (third + (h >> 32) % third) as usize,
            (2 * third + h2 % third) as usize,
        ]
    }

    fn add(&mut self, fp: u32, by: i8) {
        let check = self.check(fp);
        for p in self.positions(fp) {
            let c = &mut self.cells[p];
            c.count = c.count.wrapping_add(by);
            c.fp ^= fp;
            c.check ^= check;
        }
    }

    pub fn insert(&mut self, fp: u32) {
        self.add(fp, 1);
    }

    /// `self − other`, cell by cell. Both must have one seed and size.
    pub fn subtract(&mut self, other: &Iblt) -> Result<(), String> {
        if other.cells.len() != self.cells.len() || other.seed != self.seed {
            return Err(format!(
                "tables of {} and {} cells cannot be subtracted",
                self.cells.len(),
                other.cells.len()
            ));
        }
        for (c, o) in self.cells.iter_mut().zip(&other.cells) {
            c.count = c.count.wrapping_sub(o.count);
            c.fp ^= o.fp;
            c.check ^= o.check;
        }
        Ok(())
    }

    /// Peels the table: the fingerprints counted +1 (this side alone) and
    /// −1 (the other alone), or `None` when it does not peel to empty.
    pub fn decode(mut self) -> Option<(Vec<u32>, Vec<u32>)> {
        let (mut plus, mut minus) = (Vec::new(), Vec::new());
        let pure = |t: &Iblt, i: usize| {
            let c = t.cells[i];
            (c.count == 1 || c.count == -1) && t.check(c.fp) == c.check
        };
        let mut queue: Vec<usize> = (0..self.cells.len()).filter(|&i| pure(&self, i)).collect();
        // each peel empties at least one cell: bounded by the cell count
        let mut peels = 0;
        while let Some(i) = queue.pop() {
            if !pure(&self, i) {
                continue;
            }
            peels += 1;
            if peels > self.cells.len() {
                return None;
            }
            let c = self.cells[i];
            if c.count == 1 {
                plus.push(c.fp);
            } else {
                minus.push(c.fp);
            }
            let by = c.count.wrapping_neg();
            let positions = self.positions(c.fp);
            self.add(c.fp, by);
            queue.extend(positions.into_iter().filter(|&p| pure(&self, p)));
        }
        self.cells
            .iter()
            .all(|c| *c == Cell::default())
            .then_some((plus, minus))
    }

    /// The cells as bytes (count, fingerprint LE, check LE).
    pub fn encode(&self, out: &mut Vec<u8>) {
        for c in &self.cells {
            out.push(c.count as u8);
            out.extend_from_slice(&c.fp.to_le_bytes());
            out.extend_from_slice(&c.check.to_le_bytes());
        }
    }

    /// A table from [`Iblt::encode`]'s bytes; `None` if they are not one.
    pub fn from_bytes(seed: u64, b: &[u8]) -> Option<Iblt> {
        if b.is_empty() || !b.len().is_multiple_of(CELL_BYTES) || b.len() / CELL_BYTES > CELLS_MAX {
            return None;
        }
        let cells: Vec<Cell> = b
            .chunks_exact(CELL_BYTES)
            .map(|c| Cell {
                count: c[0] as i8,
                fp: u32::from_le_bytes([c[1], c[2], c[3], c[4]]),
                check: u16::from_le_bytes([c[5], c[6]]),
            })
            .collect();
        cells.len().is_multiple_of(HASHES).then_some(Iblt { seed, cells })
    }
}

/// Cells for a difference of about `d` fingerprints: 1.4 per difference
/// and a few more, so small tables decode too.
pub fn cells_for(d: f64) -> usize {
    ((1.4 * d).ceil() as usize + 6).max(24)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fps(seed: u64, n: usize) -> Vec<u32> {
        (0..n as u64).map(|i| mix(i + (seed << 32)) as u32).collect()
    }

    #[test]
    fn the_difference_of_two_sets_decodes_to_what_each_holds_alone() {
        for d in [0usize, 1, 5, 33, 66, 500] {
            let shared = fps(1, 20_000);
            let only_a = fps(2, d / 2 + d % 2);
            let only_b = fps(3, d / 2);
            let mut a = Iblt::new(9, cells_for(d as f64));
            let mut b = Iblt::new(9, cells_for(d as f64));
            for &f in shared.iter().chain(&only_a) {
                a.insert(f);
            }
            for &f in shared.iter().chain(&only_b) {
                b.insert(f);
            }
            a.subtract(&b).unwrap();
            let (mut plus, mut minus) = a.decode().expect("decodes");
            plus.sort_unstable();
            minus.sort_unstable();
            let (mut wa, mut wb) = (only_a.clone(), only_b.clone());
            wa.sort_unstable();
            wb.sort_unstable();
            assert_eq!((plus, minus), (wa, wb), "d = {d}");
        }
    }

    #[test]
    fn a_table_too_small_for_its_difference_says_so() {
        let mut a = Iblt::new(1, 24);
        for f in fps(4, 200) {
            a.insert(f);
        }
        assert_eq!(a.decode(), None);
    }

    #[test]
    fn tables_round_trip_through_bytes_and_bad_bytes_are_refused() {
        let mut a = Iblt::new(5, 30);
        for f in fps(6, 10) {
            a.insert(f);
        }
        let mut b = Vec::new();
        a.encode(&mut b);
        assert_eq!(b.len(), 30 * CELL_BYTES);
        assert_eq!(Iblt::from_bytes(5, &b), Some(a.clone()));
        assert_eq!(Iblt::from_bytes(5, &b[..b.len() - 1]), None);
        assert_eq!(Iblt::from_bytes(5, &[]), None);
        assert!(a.subtract(&Iblt::new(5, 60)).is_err());
    }
}
