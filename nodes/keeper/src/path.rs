//! Znode paths: validation and the parent/child split.
//!
//! A valid path is absolute, has no empty, "." or ".." component, no
//! trailing slash (but for "/"), no NUL or control characters, and is at
//! most [`PATH_BYTES_MAX`] bytes — ZooKeeper's `PathUtils.validatePath`.

/// Longest path accepted. ZooKeeper has no explicit limit below its 1 MiB
/// packet; a bound keeps the tree's keys and the log's entries small.
pub const PATH_BYTES_MAX: usize = 4096;

/// Why a path is refused.
pub fn validate(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("path is empty");
    }
    if path.len() > PATH_BYTES_MAX {
        return Err("path is longer than PATH_BYTES_MAX");
    }
    if !path.starts_with('/') {
        return Err("path must start with /");
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err("path must not end with /");
    }
    for part in path[1..].split('/') {
        if part.is_empty() {
            return Err("path has an empty component");
        }
        if part == "." || part == ".." {
            return Err("path has a relative component");
        }
    }
    if path.chars().any(|c| {
        c == '\u{0}'
            || ('\u{1}'..='\u{1f}').contains(&c)
            || ('\u{7f}'..='\u{9f}').contains(&c)
            || ('\u{e000}'..='\u{f8ff}').contains(&c)
            || ('\u{fff0}'..='\u{ffff}').contains(&c)
    }) {
        return Err("path has an invalid character");
    }
    Ok(())
}

/// The parent of a valid path other than "/".
pub fn parent(path: &str) -> &str {
    debug_assert!(path != "/" && path.starts_with('/'));
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last component of a valid path other than "/".
pub fn name(path: &str) -> &str {
    &path[path.rfind('/').map_or(0, |i| i + 1)..]
}

/// `parent` joined with a child `name`.
pub fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The prefix every descendant of `path` starts with.
pub fn child_prefix(path: &str) -> String {
    if path == "/" {
        "/".to_string()
    } else {
        format!("{path}/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_matches_zookeeper_rules() {
        for ok in ["/", "/a", "/a/b", "/a-b/c_d.e", "/zookeeper/quota"] {
            assert_eq!(validate(ok), Ok(()), "{ok}");
        }
        for bad in ["", "a", "/a/", "//a", "/a//b", "/a/./b", "/a/..", "/a\u{0}b", "/a\u{1}"] {
            assert!(validate(bad).is_err(), "{bad:?}");
        }
        assert!(validate(&format!("/{}", "x".repeat(PATH_BYTES_MAX))).is_err());
    }

    #[test]
    fn parent_and_name_split_paths() {
        assert_eq!(parent("/a"), "/");
        assert_eq!(parent("/a/b/c"), "/a/b");
        assert_eq!(name("/a/b/c"), "c");
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
        assert_eq!(child_prefix("/"), "/");
        assert_eq!(child_prefix("/a"), "/a/");
    }
}
