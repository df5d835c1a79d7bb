//! A snapshot of the guest with QuickJS already set up, in the manner of wizer.
//!
//! The guest exports `gearbox_snapshot`, which builds the JavaScript runtime, the context and
//! the prelude and keeps them in linear memory. The backend calls it once in an instance of
//! the guest (`take_snapshot` in `sandbox.rs`) and [`rewrite`] makes a new module whose
//! initial memory is that instance's memory; every run then starts from it instead of building
//! the engine again. wasmtime maps the initial memory copy-on-write and resets a pooled slot
//! to it after each run, so one run's writes never reach the next (tests/wasm.rs checks), and
//! the guest makes what QuickJS derives from the clock at context creation afresh in every run
//! (`Math.random`'s seed, `performance`).
//!
//! Only what a snapshot cannot carry makes the backend refuse one: a guest without the export,
//! a second memory or a passive data segment ([`check`]), or a stack pointer the call did not
//! restore (the module's globals and tables are kept as they are: the guest's code neither
//! sets a global but the stack pointer nor changes its function table). The backend then runs
//! the guest as it is.
//!
//! Written here rather than taken from the wizer crate: wizer pins its own wasmtime, and the
//! part gearbox needs (one call, one memory, one global checked) is a hundred lines over the
//! `wasmparser` and `wasm-encoder` crates wasmtime already builds.

use wasm_encoder::{
    ConstExpr, DataCountSection, DataSection, MemorySection, MemoryType, RawSection,
};
use wasmparser::{DataKind, Parser, Payload};

/// The guest's export that prepares the state to snapshot.
pub(crate) const INIT_EXPORT: &str = "gearbox_snapshot";
/// The guest's exported stack pointer: checked to be where the call found it.
pub(crate) const STACK_POINTER_EXPORT: &str = "__stack_pointer";
/// Bumped whenever [`rewrite`] changes what it writes: part of the cache file's name.
pub(crate) const FORMAT: u32 = 1;

/// Runs of zero bytes shorter than this stay inside one data segment (a segment's header costs
/// a few bytes; fewer segments also make a smaller module).
const ZERO_GAP: usize = 64;

const PAGE: usize = 64 * 1024;

/// Check that `wasm` is a module a snapshot can be made of: one memory, only active data
/// segments at constant offsets into it.
pub(crate) fn check(wasm: &[u8]) -> Result<(), String> {
    let mut memories = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ImportSection(s) => {
                for import in s.into_imports() {
                    let import = import.map_err(|e| e.to_string())?;
                    if matches!(import.ty, wasmparser::TypeRef::Memory(_)) {
                        return Err("the guest imports a memory".into());
                    }
                }
            }
            Payload::MemorySection(s) => memories += s.count(),
            Payload::DataSection(s) => {
                for data in s {
                    let data = data.map_err(|e| e.to_string())?;
                    match data.kind {
                        DataKind::Active {
                            memory_index: 0, ..
                        } => {}
                        _ => return Err("the guest has a passive data segment".into()),
                    }
                }
            }
            _ => {}
        }
    }
    if memories != 1 {
        return Err(format!("the guest has {memories} memories, not one"));
    }
    Ok(())
}

/// The module `wasm` with `memory` (the whole linear memory of an instance, a whole number of
/// pages) as its initial memory: the memory's minimum becomes its size, and the data segments
/// become the non-zero parts of it. Every other section is copied as it is.
pub(crate) fn rewrite(wasm: &[u8], memory: &[u8]) -> Result<Vec<u8>, String> {
    if !memory.len().is_multiple_of(PAGE) {
        return Err("the memory is not a whole number of pages".into());
    }
    let pages = (memory.len() / PAGE) as u64;
    let segments = non_zero_runs(memory);
    let mut out = wasm_encoder::Module::new();
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| e.to_string())?;
        let Some((id, range)) = payload.as_section() else {
            continue;
        };
        match payload {
            Payload::MemorySection(s) => {
                let mut section = MemorySection::new();
                for m in s {
                    let m = m.map_err(|e| e.to_string())?;
                    if m.maximum.is_some_and(|max| max < pages) {
                        return Err("the memory grew beyond its maximum".into());
                    }
                    section.memory(MemoryType {
                        minimum: pages,
                        maximum: m.maximum,
                        memory64: m.memory64,
                        shared: m.shared,
                        page_size_log2: m.page_size_log2,
                    });
                }
                out.section(&section);
            }
            Payload::DataCountSection { .. } => {
                out.section(&DataCountSection {
                    count: segments.len() as u32,
                });
            }
            Payload::DataSection(_) => {
                let mut section = DataSection::new();
                for (start, end) in &segments {
                    let offset = ConstExpr::i32_const(*start as i32);
                    section.active(0, &offset, memory[*start..*end].iter().copied());
                }
                out.section(&section);
            }
            _ => {
                out.section(&RawSection {
                    id,
                    data: &wasm[range],
                });
            }
        }
    }
    Ok(out.finish())
}

/// `[start, end)` of the parts of `memory` that are not zero, joined across short zero gaps.
fn non_zero_runs(memory: &[u8]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < memory.len() {
        if memory[i] == 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < memory.len() && memory[i] != 0 {
            i += 1;
        }
        match runs.last_mut() {
            Some(last) if start - last.1 < ZERO_GAP => last.1 = i,
            _ => runs.push((start, i)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_gaps_shorter_than_the_threshold_join_runs() {
        let mut m = vec![0u8; 1000];
        m[10] = 1;
        m[11] = 2;
        m[20] = 3; // 8 zeros after the first run: joined
        m[500] = 4; // far: a run of its own
        assert_eq!(non_zero_runs(&m), vec![(10, 21), (500, 501)]);
        assert_eq!(non_zero_runs(&[0; 100]), vec![]);
        assert_eq!(non_zero_runs(&[7; 3]), vec![(0, 3)]);
    }

    #[test]
    fn the_rewritten_guest_starts_with_the_memory_given() {
        let wasm = crate::module::GUEST_WASM;
        check(wasm).expect("the guest can be snapshot");
        let mut memory = vec![0u8; 40 * PAGE];
        memory[5] = 0xaa;
        memory[39 * PAGE + 7] = 0xbb;
        let out = rewrite(wasm, &memory).expect("rewrite");
        let mut pages = None;
        let mut data = Vec::new();
        for payload in Parser::new(0).parse_all(&out) {
            match payload.expect("valid module") {
                Payload::MemorySection(s) => {
                    let m = s.into_iter().next().expect("a memory");
                    pages = Some(m.expect("a valid memory").initial);
                }
                Payload::DataSection(s) => {
                    for d in s {
                        data.push(d.expect("a valid segment").data.to_vec());
                    }
                }
                _ => {}
            }
        }
        assert_eq!(pages, Some(40));
        assert_eq!(data, vec![vec![0xaa], vec![0xbb]]);
        wasmparser::Validator::new()
            .validate_all(&out)
            .expect("the rewritten module validates");
    }
}
