//! Rich outputs over MCP, with matplotlib, PIL and pandas from `packages` (one layer, installed
//! once): figures and images come back as `image` contents whose PNGs decode to the right
//! size; a large one comes back downscaled, and in a session its full size is a
//! `resource_link` that `resources/read` serves; a live session shows the figures a cell
//! leaves open; a DataFrame is a compact text table. Run with
//! `cargo test --workspace --test mcp -- pictures::`.

use std::path::PathBuf;

use base64::Engine as _;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, ReadResourceRequestParams,
    ResourceContents,
};
use rmcp::service::RunningService;
use serde_json::{Value, json};

use crate::support::{TempDir, obj, structured, text};

const PACKAGES: [&str; 2] = ["matplotlib", "pandas"];

struct Server {
    session: RunningService<RoleClient, ()>,
    _dir: TempDir,
}

/// The package cache the tests share (one layer, installed once per test process; the
/// store locks it), removed when the process exits. Layers are mounted from the host: not
/// under /tmp (the sandbox has its own), and walkable by the sandbox user.
fn cache() -> &'static PathBuf {
    static CACHE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    extern "C" fn remove() {
        if let Some(c) = CACHE.get() {
            let _ = std::fs::remove_dir_all(c);
        }
    }
    CACHE.get_or_init(|| {
        let cache = PathBuf::from(format!("/var/tmp/gearbox-pictures-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        std::fs::create_dir_all(&cache).expect("mkdir");
        std::fs::set_permissions(&cache, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        // SAFETY: registering a plain extern "C" function without arguments.
        unsafe { libc::atexit(remove) };
        cache
    })
}

async fn start(tag: &str) -> Server {
    let dir = TempDir::new(tag);
    let cache = cache();
    let config = dir.0.join("gearbox.toml");
    std::fs::write(
        &config,
        format!(
            "gear = \"full_trust\"\npool = {{}}\n[limits]\ntimeout_ms = 120000\nmemory_mb = 1024\n\
             [sessions]\ndir = {:?}\n[packages]\ncache_dir = {:?}\ninstall_timeout_ms = 600000\n",
            dir.0.join("sessions").display().to_string(),
            cache.display().to_string()
        ),
    )
    .expect("config");
    let (session, _) = crate::support::serve_sessions(&config).await;
    Server { session, _dir: dir }
}

async fn call(s: &Server, tool: &str, args: Value) -> CallToolResult {
    s.session
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(obj(args)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// Width and height of a PNG, from its header.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    (be(16), be(20))
}

/// The PNG images of a result, decoded.
fn images(r: &CallToolResult) -> Vec<Vec<u8>> {
    r.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Image(i) => {
                assert_eq!(i.mime_type, "image/png");
                Some(
                    base64::engine::general_purpose::STANDARD
                        .decode(&i.data)
                        .expect("base64"),
                )
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn figures_images_and_tables_come_back() {
    let s = start("stateless").await;
    let code = "import matplotlib.pyplot as plt\n\
                fig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n\
                ax.plot([1, 2, 3], [1, 4, 9])\n\
                plt.show()\n\
                from PIL import Image\n\
                from gearbox_display import display\n\
                display(Image.new('RGB', (200, 100), 'red'))\n\
                import pandas as pd\n\
                display(pd.DataFrame({'n': range(100), 'sq': [i * i for i in range(100)]}))\n";
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": code, "packages": PACKAGES}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let pngs = images(&r);
    assert_eq!(pngs.len(), 2, "{}", text(&r));
    assert_eq!(png_size(&pngs[0]), (400, 300), "the figure at its size");
    assert_eq!(png_size(&pngs[1]), (200, 100), "the PIL image at its size");
    let v = structured(&r);
    assert_eq!(v["pictures"][0]["width"], 400, "{v}");
    // The table: compact (30 rows at most, with the elision), as text in stdout.
    let out = v["stdout"].as_str().expect("stdout");
    assert!(
        out.contains("sq") && out.contains("9801") && out.contains(".."),
        "{out}"
    );
    assert!(out.lines().count() < 40, "{out}");
    assert!(!out.contains("gearbox-display"), "{out}");
}

/// The resource links of a result: (uri, name, mime type, size, description).
fn links(r: &CallToolResult) -> Vec<(String, String, String, u64, String)> {
    r.content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::ResourceLink(l) => Some((
                l.uri.clone(),
                l.name.clone(),
                l.mime_type.clone().unwrap_or_default(),
                l.size.unwrap_or_default(),
                l.description.clone().unwrap_or_default(),
            )),
            _ => None,
        })
        .collect()
}

/// `resources/read` of `uri`: its bytes (text or blob) and MIME type.
async fn read(s: &Server, uri: &str) -> (Vec<u8>, Option<String>) {
    let read = s
        .session
        .read_resource(ReadResourceRequestParams::new(uri.to_string()))
        .await
        .unwrap_or_else(|e| panic!("read {uri}: {e}"));
    match &read.contents[0] {
        ResourceContents::BlobResourceContents {
            blob, mime_type, ..
        } => (
            base64::engine::general_purpose::STANDARD
                .decode(blob)
                .expect("base64"),
            mime_type.clone(),
        ),
        ResourceContents::TextResourceContents {
            text, mime_type, ..
        } => (text.as_bytes().to_vec(), mime_type.clone()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_stateless_runs_outputs_are_linked_and_read() {
    let s = start("outputs").await;
    let code = "import os\nos.makedirs('/work/outputs/sub')\n\
                open('/work/outputs/a.csv', 'w').write('x,y\\n1,2\\n')\n\
                open('/work/outputs/sub/b.png', 'wb').write(bytes(range(256)))\n\
                os.symlink('/etc/passwd', '/work/outputs/passwd')\n";
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": code}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let l = links(&r);
    assert_eq!(l.len(), 2, "{l:?}");
    let (csv, png) = (&l[0], &l[1]);
    assert!(
        csv.0.starts_with("gearbox://runs/") && csv.0.ends_with("/outputs/a.csv"),
        "{csv:?}"
    );
    assert_eq!(
        (csv.1.as_str(), csv.2.as_str(), csv.3),
        ("outputs/a.csv", "text/csv", 8)
    );
    assert_eq!(
        (png.1.as_str(), png.2.as_str(), png.3),
        ("outputs/sub/b.png", "image/png", 256)
    );
    assert_eq!(
        read(&s, &csv.0).await,
        (b"x,y\n1,2\n".to_vec(), Some("text/csv".into()))
    );
    assert_eq!(
        read(&s, &png.0).await,
        ((0..=255u8).collect::<Vec<u8>>(), Some("image/png".into()))
    );
    // The structured outcome lists them, and the symlink as not kept.
    let v = structured(&r);
    assert_eq!(v["outputs"][0]["uri"], csv.0.as_str(), "{v}");
    assert!(
        v["outputs_skipped"][0]
            .as_str()
            .is_some_and(|n| n.contains("passwd") && n.contains("symlink")),
        "{v}"
    );
    // Nothing else under the prefix: a made-up id, a path beside the run's own.
    for uri in [
        csv.0.replace("a.csv", "passwd"),
        csv.0.replace("a.csv", "../a.csv"),
        "gearbox://runs/00000000-0000-4000-8000-000000000000/outputs/a.csv".to_string(),
    ] {
        assert!(
            s.session
                .read_resource(ReadResourceRequestParams::new(uri.clone()))
                .await
                .is_err(),
            "{uri} was read"
        );
    }
    // exec_get_artifact reads them too, by the run's id, in pages.
    let id = csv
        .0
        .strip_prefix("gearbox://runs/")
        .and_then(|r| r.split('/').next())
        .expect("the run's id");
    let r = call(
        &s,
        "exec_get_artifact",
        json!({"session_id": id, "path": "outputs/a.csv", "offset": 4, "max_bytes": 3}),
    )
    .await;
    let v = structured(&r);
    assert_eq!(
        (&v["content"], &v["size"], &v["next_offset"], &v["uri"]),
        (&json!("1,2"), &json!(8), &json!(7), &json!(csv.0)),
        "{v}"
    );
    let r = call(
        &s,
        "exec_get_artifact",
        json!({"session_id": id, "path": "outputs/sub/b.png"}),
    )
    .await;
    assert_eq!(structured(&r)["encoding"], "base64", "{}", text(&r));
    let r = call(
        &s,
        "exec_get_artifact",
        json!({"session_id": id, "path": "outputs/passwd"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true), "{}", text(&r));
    assert!(text(&r).contains("outputs/a.csv"), "{}", text(&r));
}

#[tokio::test]
async fn a_large_figure_in_a_stateless_run_is_linked_full_size() {
    let s = start("large-stateless").await;
    let code = "import matplotlib.pyplot as plt\n\
                plt.figure(figsize=(30, 20), dpi=100)\n\
                plt.plot(range(10))\n";
    let r = call(
        &s,
        "execute_code",
        json!({"language": "python", "code": code, "packages": PACKAGES}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let pngs = images(&r);
    assert_eq!(pngs.len(), 1, "{}", text(&r));
    let (w, h) = png_size(&pngs[0]);
    assert!(w == 1024 && h <= 1024, "downscaled to {w}x{h}");
    let l = links(&r);
    let full = l
        .iter()
        .find(|l| l.4 == "the full-size picture")
        .unwrap_or_else(|| panic!("a link to the full size: {l:?}"));
    assert!(
        full.0.starts_with("gearbox://runs/") && full.0.ends_with("/outputs/display-1.png"),
        "{full:?}"
    );
    assert_eq!(full.2, "image/png");
    let (bytes, mime) = read(&s, &full.0).await;
    assert_eq!(mime.as_deref(), Some("image/png"));
    assert_eq!(png_size(&bytes), (3000, 2000));
}

#[tokio::test]
async fn a_large_figure_is_downscaled_inline_and_kept_full_size_in_a_session() {
    let s = start("large").await;
    let r = call(&s, "exec_open", json!({})).await;
    let id = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    let code = "import matplotlib.pyplot as plt\n\
                plt.figure(figsize=(30, 20), dpi=100)\n\
                plt.plot(range(10))\n";
    let r = call(
        &s,
        "exec_run",
        json!({"session_id": id, "language": "python", "code": code, "packages": PACKAGES}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let pngs = images(&r);
    assert_eq!(pngs.len(), 1, "the figure left open is shown: {}", text(&r));
    let (w, h) = png_size(&pngs[0]);
    assert!(w <= 1024 && h <= 1024 && w == 1024, "downscaled to {w}x{h}");
    assert!(pngs[0].len() <= 256 * 1024, "{} bytes", pngs[0].len());
    let v = structured(&r);
    assert_eq!(v["pictures"][0]["original"], json!([3000, 2000]), "{v}");
    let link = r
        .content
        .iter()
        .find_map(|c| match c {
            ContentBlock::ResourceLink(l) => Some(l.uri.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a resource link to the full size: {}", text(&r)));
    assert!(link.ends_with("/files/outputs/display-1.png"), "{link}");
    let read = s
        .session
        .read_resource(ReadResourceRequestParams::new(link))
        .await
        .expect("read the full size");
    let full = match &read.contents[0] {
        ResourceContents::BlobResourceContents { blob, .. } => {
            base64::engine::general_purpose::STANDARD
                .decode(blob)
                .expect("base64")
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(png_size(&full), (3000, 2000));
}

#[tokio::test]
async fn a_live_session_shows_the_figures_a_cell_leaves_open_and_a_figure_it_returns() {
    let s = start("live").await;
    let r = call(
        &s,
        "exec_open",
        json!({"stateful": true, "language": "python", "packages": PACKAGES}),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let id = structured(&r)["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    let cell = |code: &'static str| json!({"session_id": id, "language": "python", "code": code});
    let r = call(
        &s,
        "exec_run",
        cell("import matplotlib.pyplot as plt\nplt.figure(figsize=(3, 2), dpi=100)\nplt.plot([3, 1, 2])\nx = 1"),
    )
    .await;
    let pngs = images(&r);
    assert_eq!(pngs.len(), 1, "{}", text(&r));
    assert_eq!(png_size(&pngs[0]), (300, 200));
    // A cell whose value is a figure shows it once (not also as a figure left open).
    let r = call(
        &s,
        "exec_run",
        cell("fig = plt.figure(figsize=(2, 2), dpi=100)\nplt.plot([1, 2])\nfig"),
    )
    .await;
    let pngs = images(&r);
    assert_eq!(pngs.len(), 1, "{}", text(&r));
    assert_eq!(png_size(&pngs[0]), (200, 200));
    assert!(structured(&r).get("result").is_none(), "{}", text(&r));
    // A DataFrame built in one cell is used in the next.
    let r = call(
        &s,
        "exec_run",
        cell("import pandas as pd\ndf = pd.DataFrame({'n': range(1000)})\ndf['sq'] = df['n'] ** 2"),
    )
    .await;
    assert_eq!(structured(&r)["status"], "ok", "{}", text(&r));
    let r = call(&s, "exec_run", cell("int(df['sq'].sum())")).await;
    assert_eq!(structured(&r)["result"], "332833500", "{}", text(&r));
    // Nothing left to show in the next cell.
    let r = call(&s, "exec_run", cell("x + 1")).await;
    assert!(images(&r).is_empty(), "{}", text(&r));
    assert_eq!(structured(&r)["result"], "2");
    // A large one: downscaled inline, its full size linked and read from the live sandbox.
    let r = call(
        &s,
        "exec_run",
        cell("big = plt.figure(figsize=(30, 20), dpi=100)\nplt.plot(range(10))\nbig"),
    )
    .await;
    let pngs = images(&r);
    assert_eq!(pngs.len(), 1, "{}", text(&r));
    assert_eq!(png_size(&pngs[0]).0, 1024);
    let link = r
        .content
        .iter()
        .find_map(|c| match c {
            ContentBlock::ResourceLink(l) => Some(l.uri.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a link to the full size: {}", text(&r)));
    let read = s
        .session
        .read_resource(ReadResourceRequestParams::new(link))
        .await
        .expect("read the full size");
    let full = match &read.contents[0] {
        ResourceContents::BlobResourceContents { blob, .. } => {
            base64::engine::general_purpose::STANDARD
                .decode(blob)
                .expect("base64")
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(png_size(&full), (3000, 2000));
}
