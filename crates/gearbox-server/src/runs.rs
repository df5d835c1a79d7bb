//! The outputs of runs without a session (`/work/outputs/`, see docs/PICTURES.md): kept in
//! this process's memory for [`TTL`], at most [`MAX_BYTES`] in all (the oldest go first),
//! each run's under a fresh random id and owned by the tenant that ran it, served by
//! `resources/read` as `gearbox://runs/{id}/outputs/{path}`. Nothing is written to disk: a
//! server without the `sessions` profile stays stateless on the host.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use gearbox_core::{Outcome, OutputFile};
use rmcp::ErrorData as McpError;
use rmcp::model::{ReadResourceResult, ResourceContents};
use serde_json::json;

/// Prefix of a run's output URIs.
pub const RUNS_PREFIX: &str = "gearbox://runs/";
/// The template of a run's output URIs.
pub const RUNS_TEMPLATE: &str = "gearbox://runs/{id}/outputs/{path}";
/// How long a run's outputs stay readable.
pub const TTL: Duration = Duration::from_secs(15 * 60);
/// Bytes of outputs kept at once, all runs and tenants together.
pub const MAX_BYTES: u64 = 256 * 1024 * 1024;

struct Kept {
    owner: String,
    at: Instant,
    files: Vec<OutputFile>,
}

fn store() -> &'static Mutex<VecDeque<Kept>> {
    static STORE: OnceLock<Mutex<VecDeque<Kept>>> = OnceLock::new();
    STORE.get_or_init(|| Mutex::new(VecDeque::new()))
}

/// Keep `outcome`'s outputs for `owner` under a fresh id, and give each its URI.
pub fn keep(owner: &str, outcome: &mut Outcome) {
    if outcome.outputs.is_empty() {
        return;
    }
    let id = uuid::Uuid::new_v4().to_string();
    for f in &mut outcome.outputs {
        f.uri = Some(uri(&id, &f.path));
    }
    let files = outcome.outputs.clone();
    let mut kept = store().lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|k| k.at.elapsed() < TTL);
    kept.push_back(Kept {
        owner: owner.to_string(),
        at: Instant::now(),
        files,
    });
    let size = |k: &Kept| k.files.iter().map(|f| f.size).sum::<u64>();
    while kept.iter().map(size).sum::<u64>() > MAX_BYTES && kept.len() > 1 {
        kept.pop_front();
    }
}

/// The URI of `path` (relative to `/work`, `outputs/…`) of run `id`, percent-encoded but
/// for unreserved characters and `/`.
fn uri(id: &str, path: &str) -> String {
    let mut uri = format!("{RUNS_PREFIX}{id}/");
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri
}

/// Whether `uri` names a run's output.
pub fn is_runs_uri(uri: &str) -> bool {
    uri.starts_with(RUNS_PREFIX)
}

/// Whether `id` names a run whose outputs `tenant` may read (kept, not expired, its own).
pub fn owns(id: &str, tenant: &str) -> bool {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return false;
    }
    let mut kept = store().lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|k| k.at.elapsed() < TTL);
    let prefix = format!("{RUNS_PREFIX}{id}/");
    kept.iter().any(|k| {
        k.owner == tenant
            && k.files
                .iter()
                .any(|f| f.uri.as_deref().is_some_and(|u| u.starts_with(&prefix)))
    })
}

/// At most `max` bytes from `offset` of output `path` (`outputs/…`) of run `id`: its URI,
/// the file's whole size, the bytes. An unknown path is an error naming the run's outputs.
pub fn read_page(
    id: &str,
    tenant: &str,
    path: &str,
    offset: u64,
    max: u64,
) -> Result<(String, u64, Vec<u8>), String> {
    let kept = store().lock().unwrap_or_else(|p| p.into_inner());
    let prefix = format!("{RUNS_PREFIX}{id}/");
    let files: Vec<&OutputFile> = kept
        .iter()
        .filter(|k| k.owner == tenant && k.at.elapsed() < TTL)
        .flat_map(|k| &k.files)
        .filter(|f| f.uri.as_deref().is_some_and(|u| u.starts_with(&prefix)))
        .collect();
    let Some(file) = files.iter().find(|f| f.path == path) else {
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        return Err(format!(
            "no output {path:?} in run {id}; its outputs: {}",
            names.join(", ")
        ));
    };
    let size = file.content.len() as u64;
    let start = usize::try_from(offset.min(size)).unwrap_or(usize::MAX);
    let end = usize::try_from(offset.saturating_add(max).min(size)).unwrap_or(usize::MAX);
    Ok((
        file.uri.clone().unwrap_or_default(),
        size,
        file.content[start..end].to_vec(),
    ))
}

/// `resources/read` of a run's output: the bytes, as text when they are UTF-8 and as a
/// base64 blob otherwise, with the MIME type guessed from the name. Another tenant's, an
/// expired or an unknown one is "not found", alike.
pub fn read_resource(uri: &str, tenant: &str) -> Result<ReadResourceResult, McpError> {
    let not_found = || {
        McpError::resource_not_found(
            format!("no run output {uri:?} (expired, or never kept)"),
            Some(json!({ "uri": uri })),
        )
    };
    let mut kept = store().lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|k| k.at.elapsed() < TTL);
    // The URI is compared whole with the ones the server gave out: nothing in it is used as
    // a path.
    let file = kept
        .iter()
        .filter(|k| k.owner == tenant)
        .flat_map(|k| &k.files)
        .find(|f| f.uri.as_deref() == Some(uri))
        .ok_or_else(not_found)?;
    let contents = match std::str::from_utf8(&file.content) {
        Ok(t) if !file.mime_type.starts_with("image/") || file.mime_type == "image/svg+xml" => {
            ResourceContents::text(t, uri).with_mime_type(file.mime_type.clone())
        }
        _ => ResourceContents::blob(
            base64::engine::general_purpose::STANDARD.encode(&file.content),
            uri,
        )
        .with_mime_type(file.mime_type.clone()),
    };
    Ok(ReadResourceResult::new(vec![contents]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(files: &[(&str, &[u8])]) -> Outcome {
        let mut o = Outcome::failed_to_start("python", "linux", "x");
        o.outputs = files
            .iter()
            .map(|(p, c)| OutputFile::new(p.to_string(), c.to_vec()))
            .collect();
        o
    }

    #[test]
    fn kept_outputs_are_their_owners_alone() {
        let mut o = outcome(&[
            ("outputs/a.csv", b"x,y\n1,2\n"),
            ("outputs/b c.png", &[0x89, 0]),
        ]);
        keep("alice", &mut o);
        let a = o.outputs[0].uri.clone().expect("uri");
        let b = o.outputs[1].uri.clone().expect("uri");
        assert!(
            a.starts_with(RUNS_PREFIX) && a.ends_with("/outputs/a.csv"),
            "{a}"
        );
        assert!(b.ends_with("/outputs/b%20c.png"), "{b}");
        let r = read_resource(&a, "alice").expect("read");
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["contents"][0]["text"], "x,y\n1,2\n");
        assert_eq!(v["contents"][0]["mimeType"], "text/csv");
        let r = read_resource(&b, "alice").expect("read");
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["contents"][0]["mimeType"], "image/png");
        assert!(v["contents"][0]["blob"].is_string());
        assert!(read_resource(&a, "bob").is_err());
        let other = a.replace("a.csv", "../a.csv");
        assert!(read_resource(&other, "alice").is_err());
        assert!(read_resource("gearbox://runs/x/outputs/a.csv", "alice").is_err());
    }

    #[test]
    fn a_runs_outputs_are_read_in_pages_by_their_owner() {
        let mut o = outcome(&[("outputs/long.txt", b"0123456789")]);
        keep("carol", &mut o);
        let uri = o.outputs[0].uri.clone().expect("uri");
        let id = uri
            .strip_prefix(RUNS_PREFIX)
            .and_then(|r| r.split('/').next())
            .expect("id")
            .to_string();
        assert!(owns(&id, "carol"));
        assert!(!owns(&id, "dave"), "another tenant's run is unknown");
        assert!(!owns(&format!("{id}/outputs"), "carol"), "an id is an id");
        assert!(!owns("", "carol"));
        let (u, size, bytes) = read_page(&id, "carol", "outputs/long.txt", 4, 3).expect("page");
        assert_eq!(
            (u.as_str(), size, bytes.as_slice()),
            (uri.as_str(), 10, &b"456"[..])
        );
        let (_, _, tail) = read_page(&id, "carol", "outputs/long.txt", 8, 100).expect("tail");
        assert_eq!(tail, b"89");
        let (_, _, none) = read_page(&id, "carol", "outputs/long.txt", 99, 5).expect("past end");
        assert!(none.is_empty());
        let e = read_page(&id, "carol", "outputs/other.txt", 0, 5).expect_err("unknown path");
        assert!(e.contains("outputs/long.txt"), "{e}");
        assert!(read_page(&id, "dave", "outputs/long.txt", 0, 5).is_err());
    }
}
