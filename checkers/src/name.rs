//! [`Name`]: the short strings a history repeats on line after line — an
//! op's `f`, its `key`, its `node` — held once and shared by every op that
//! carries them. A million-op history names a handful of functions and a
//! few keys: reading it so allocates a few strings rather than millions,
//! and each op is smaller (a shared string is two words, an owned one
//! three).

use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// An immutable string shared by reference count. It reads as a `str`
/// (`&*name`, `name.as_str()`, `name == "read"`), compares and orders as
/// one, and serializes as a JSON string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(Arc<str>);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name(Arc::from(s))
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name(Arc::from(s))
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Name {
        Name(Arc::from(s.as_str()))
    }
}

impl From<Name> for String {
    fn from(n: Name) -> String {
        n.0.to_string()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        self == &*other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == &*other.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Name, D::Error> {
        String::deserialize(d).map(Name::from)
    }
}

/// Distinct names held at most by one [`Interner`]: a history whose keys
/// are all different (a set workload's elements) gains nothing from
/// sharing them, and the table would only grow.
const INTERNED_MAX: usize = 1 << 16;

/// Hands out one shared [`Name`] per distinct string it is given (up to
/// [`INTERNED_MAX`] of them; past that, new strings get names of their
/// own).
#[derive(Default)]
pub struct Interner {
    names: HashSet<Name, rustc_hash::FxBuildHasher>,
}

impl Interner {
    pub fn new() -> Interner {
        Interner::default()
    }

    pub fn name(&mut self, s: &str) -> Name {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n = Name::from(s);
        if self.names.len() < INTERNED_MAX {
            self.names.insert(n.clone());
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_reads_compares_and_serializes_as_its_string() {
        let n = Name::from("read");
        assert_eq!(n, "read");
        assert!("read" == n);
        assert_eq!(n.as_str(), "read");
        assert_eq!(format!("{n} {n:?}"), "read \"read\"");
        assert_eq!(serde_json::to_string(&n).unwrap(), "\"read\"");
        let back: Name = serde_json::from_str("\"read\"").unwrap();
        assert_eq!(back, n);
        let (a, b) = (Name::from("a"), Name::from("b"));
        assert!(a < b);
    }

    #[test]
    fn the_interner_shares_equal_strings_and_stops_growing_at_its_bound() {
        let mut i = Interner::new();
        let a = i.name("cas");
        let b = i.name("cas");
        assert!(Arc::ptr_eq(&a.0, &b.0));
        for k in 0..INTERNED_MAX + 10 {
            i.name(&k.to_string());
        }
        assert_eq!(i.names.len(), INTERNED_MAX);
        // past the bound a name is still right, only not shared
        assert_eq!(i.name("x-new"), "x-new");
    }
}
