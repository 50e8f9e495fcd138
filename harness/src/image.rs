//! The node image for the Docker backend, built without a registry: the
//! running `drift` executable (which must be statically linked), an
//! `/etc/passwd`, and empty `/data` and `/tmp`, written as a tar by drift
//! itself and imported with `docker import`, tagged with the executable's
//! SHA-256 so an unchanged binary is not imported twice (`drift
//! build-image`, or a docker campaign when it needs one).
//!
//! The tar is plain ustar, written here: a handful of entries with fixed
//! modes needs no archive crate.

use crate::container::ContainerEngine;
use crate::fail::Failure;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

/// The image's name; the tag is the executable's hash.
pub const REPOSITORY: &str = "drift-node";
/// Where the executable lives in the image (its entrypoint).
pub const EXE_IN_IMAGE: &str = "/drift";

/// How to build a drift that can go into the image.
pub const STATIC_HINT: &str = "OPENSSL_STATIC=1 RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu -p drift-harness (then run target/x86_64-unknown-linux-gnu/release/drift)";

/// Whether the ELF executable `bytes` asks for a dynamic loader (a
/// `PT_INTERP` program header): such a binary cannot run in an image with
/// nothing else in it. `Err` when the bytes are not a 64-bit ELF file.
pub fn is_dynamic(bytes: &[u8]) -> Result<bool, String> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return Err("not a 64-bit little-endian ELF executable".into());
    }
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().expect("8 bytes")) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    for k in 0..phnum {
        let at = phoff + k * phentsize;
        let Some(p) = bytes.get(at..at + 4) else {
            return Err("program headers past the end of the file".into());
        };
        if u32::from_le_bytes(p.try_into().expect("4 bytes")) == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// One ustar header for `name` (a file of `size` bytes, or a directory).
fn header(name: &str, size: u64, mode: u32, dir: bool) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |h: &mut [u8; 512], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}\0", w = width - 1);
        h[at..at + width].copy_from_slice(s.as_bytes());
    };
    octal(&mut h, 100, 8, mode as u64);
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, size);
    octal(&mut h, 136, 12, 0);
    h[156] = if dir { b'5' } else { b'0' };
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // the checksum counts its own field as spaces
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

/// The image's root filesystem as a tar.
pub fn rootfs_tar(exe: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(exe.len() + 8192);
    let file = |t: &mut Vec<u8>, name: &str, body: &[u8], mode: u32| {
        t.extend_from_slice(&header(name, body.len() as u64, mode, false));
        t.extend_from_slice(body);
        t.resize(t.len().div_ceil(512) * 512, 0);
    };
    for d in ["data/", "tmp/", "etc/"] {
        t.extend_from_slice(&header(d, 0, 0o1777, true));
    }
    file(&mut t, "etc/passwd", b"root:x:0:0:root:/:/drift\n", 0o644);
    file(&mut t, EXE_IN_IMAGE.trim_start_matches('/'), exe, 0o755);
    t.extend_from_slice(&[0u8; 1024]);
    t
}

/// The tag of the image holding `exe`.
pub fn tag_of(exe: &[u8]) -> String {
    let d = Sha256::digest(exe);
    let hex: String = d.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{REPOSITORY}:{hex}")
}

/// Builds (or finds) the image of the running executable; its tag.
pub fn ensure(engine: &dyn ContainerEngine, scratch: &Path) -> Result<String, Failure> {
    let exe_path = std::env::current_exe().map_err(|e| Failure::new(format!("the running executable: {e}")))?;
    let exe = std::fs::read(&exe_path).map_err(|e| Failure::new(format!("{}: {e}", exe_path.display())))?;
    match is_dynamic(&exe) {
        Ok(false) => {}
        Ok(true) => {
            return Err(Failure::new(format!(
                "{} is dynamically linked and cannot run in a container image with nothing else in it; build a static drift: {STATIC_HINT}",
                exe_path.display()
            )))
        }
        Err(e) => return Err(Failure::new(format!("{}: {e}", exe_path.display()))),
    }
    let tag = tag_of(&exe);
    if engine.has_image(&tag).map_err(Failure::new)? {
        return Ok(tag);
    }
    std::fs::create_dir_all(scratch).map_err(|e| Failure::new(format!("{}: {e}", scratch.display())))?;
    let tar_path = scratch.join("drift-rootfs.tar");
    let mut f = std::fs::File::create(&tar_path).map_err(|e| Failure::new(format!("{}: {e}", tar_path.display())))?;
    f.write_all(&rootfs_tar(&exe))
        .map_err(|e| Failure::new(format!("{}: {e}", tar_path.display())))?;
    drop(f);
    let imported = engine.import(&tar_path, &tag, &[EXE_IN_IMAGE]);
    let _ = std::fs::remove_file(&tar_path);
    imported.map_err(Failure::new)?;
    Ok(tag)
}

/// `drift build-image`: builds (or finds) the image and prints its tag.
pub fn build_image() -> Result<i32, Failure> {
    let engine = crate::container::Cli::docker();
    engine
        .available()
        .map_err(|e| Failure::new(format!("the docker engine does not answer: {e}")))?;
    let scratch = std::env::temp_dir().join(format!("drift-image-{}", std::process::id()));
    let tag = ensure(&engine, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    out!("{}", tag?);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tar_lists_its_entries_with_valid_checksums() {
        let t = rootfs_tar(b"#!fake executable");
        assert_eq!(t.len() % 512, 0);
        let mut at = 0;
        let mut names = Vec::new();
        while at + 512 <= t.len() && t[at] != 0 {
            let h = &t[at..at + 512];
            let name = String::from_utf8_lossy(&h[..100]).trim_end_matches('\0').to_string();
            let size = u64::from_str_radix(String::from_utf8_lossy(&h[124..135]).trim_end_matches('\0'), 8).unwrap();
            let stored = u32::from_str_radix(String::from_utf8_lossy(&h[148..154]).trim(), 8).unwrap();
            let mut copy = h.to_vec();
            copy[148..156].copy_from_slice(b"        ");
            assert_eq!(stored, copy.iter().map(|&b| b as u32).sum::<u32>(), "{name}");
            names.push(name);
            at += 512 + (size as usize).div_ceil(512) * 512;
        }
        assert_eq!(names, ["data/", "tmp/", "etc/", "etc/passwd", "drift"]);
    }

    #[test]
    fn a_dynamic_executable_is_told_apart_from_a_static_one() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // the test binary is built like drift: dynamic unless asked otherwise
        assert!(is_dynamic(&me).is_ok());
        assert!(is_dynamic(b"not elf").is_err());
        // a minimal ELF header with no program headers is static
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        assert_eq!(is_dynamic(&elf), Ok(false));
        // ... and one PT_INTERP header makes it dynamic
        elf[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        elf.extend_from_slice(&3u32.to_le_bytes());
        elf.extend_from_slice(&[0u8; 52]);
        assert_eq!(is_dynamic(&elf), Ok(true));
    }
}
