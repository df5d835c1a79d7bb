//! Pictures a program shows come back beside its output, on every path a run can take (cold,
//! and the warm one: the fork server, or a helper-built warm sandbox): gearbox's display
//! hooks are in every `linux` sandbox, and the engine takes the pictures out of stdout,
//! checking each against its own bytes. matplotlib and PIL (which come from `packages`) are
//! checked over MCP (`tests/mcp/pictures.rs`).

use gearbox_core::Status;

use crate::integrity::{on, paths};
use crate::support::run;

/// A Python prelude that makes a PNG of `w`×`h` with zlib alone.
const PNG: &str = r#"import struct, zlib
def png(w, h):
    raw = b''.join(b'\x00' + b'\xff\x00\x00' * w for _ in range(h))
    def chunk(t, d):
        return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
            + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
from gearbox_display import display
"#;

#[tokio::test]
async fn pictures_come_back_on_every_path_and_are_checked() {
    let code = format!(
        "{PNG}print('before')\n\
         display(png(64, 32))\n\
         display(b\"<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'/>\")\n\
         print('after')\n\
         print('\\x1egearbox-display {{\"mime\": \"image/png\", \"data\": \"AAAA\", \"width\": 5000}}')\n"
    );
    for (path, engine) in paths("python") {
        let o = on(&path, &engine, run("python", &code)).await;
        assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
        assert_eq!(
            o.stdout,
            "before\nafter\n[gearbox: a picture is not shown: the picture is not a image/png]\n",
            "{path}: the pictures' lines are taken out, a forged one is a note"
        );
        assert_eq!(o.pictures.len(), 2, "{path}: {:?}", o.pictures);
        let p = &o.pictures[0];
        assert_eq!((p.mime.as_str(), p.width, p.height), ("image/png", 64, 32));
        assert!(p.bytes > 50 && !p.data.is_empty(), "{p:?}");
        assert_eq!(o.pictures[1].mime, "image/svg+xml");
        // The structured outcome names them, without their bytes.
        let v = serde_json::to_value(&o).expect("json");
        assert_eq!(v["pictures"][0]["width"], 64, "{path}: {v}");
        assert!(v["pictures"][0].get("data").is_none(), "{path}: {v}");
    }
}

#[tokio::test]
async fn a_picture_too_large_to_show_without_pil_is_kept_with_a_note() {
    let code = format!(
        "{PNG}display(png(3000, 4))\nimport os\nprint(sorted(os.listdir('/work/outputs')))\n"
    );
    for (path, engine) in paths("python") {
        let o = on(&path, &engine, run("python", &code)).await;
        assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
        assert!(o.pictures.is_empty(), "{path}: {o:?}");
        assert!(
            o.stdout
                .contains("3000x4 picture is too large to show inline and PIL is not there")
                && o.stdout.contains("kept as outputs/display-1.png")
                && o.stdout.contains("['display-1.png']"),
            "{path}: {o:?}"
        );
    }
}

#[tokio::test]
async fn matplotlib_is_pointed_at_gearbox_and_a_program_may_choose_otherwise() {
    let code = "import os, sys\nprint(os.environ['MPLBACKEND'], os.environ['MPLCONFIGDIR'], '/.gearbox/python' in sys.path)";
    for (path, engine) in paths("python") {
        let o = on(&path, &engine, run("python", code)).await;
        assert_eq!(
            o.stdout, "module://gearbox_mpl_backend /tmp/.matplotlib True\n",
            "{path}: {o:?}"
        );
    }
    let (_, cold) = paths("python").remove(0);
    let o = on(
        "cold",
        &cold,
        run("python", "import os\nprint(os.environ['MPLBACKEND'])").env("MPLBACKEND", "agg"),
    )
    .await;
    assert_eq!(o.stdout, "agg\n", "{o:?}");
}

#[tokio::test]
async fn javascript_programs_display_pictures_and_tables() {
    let code = "const zlib = require('zlib');\n\
                function png(w, h) {\n\
                  const crcTable = [...Array(256).keys()].map((n) => { let c = n; for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1; return c >>> 0; });\n\
                  const crc = (b) => { let c = 0xffffffff; for (const x of b) c = crcTable[(c ^ x) & 0xff] ^ (c >>> 8); return (c ^ 0xffffffff) >>> 0; };\n\
                  const chunk = (t, d) => { const len = Buffer.alloc(4); len.writeUInt32BE(d.length); const td = Buffer.concat([Buffer.from(t), d]); const c = Buffer.alloc(4); c.writeUInt32BE(crc(td)); return Buffer.concat([len, td, c]); };\n\
                  const ihdr = Buffer.alloc(13); ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4); ihdr[8] = 8; ihdr[9] = 2;\n\
                  const raw = Buffer.concat([...Array(h)].map(() => Buffer.concat([Buffer.from([0]), Buffer.alloc(w * 3, 0x7f)])));\n\
                  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr), chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);\n\
                }\n\
                const { display } = require('gearbox_display');\n\
                display(png(48, 16));\n\
                display([{ n: 1, sq: 1 }, { n: 2, sq: 4 }]);\n";
    for (path, engine) in paths("javascript") {
        let o = on(&path, &engine, run("javascript", code)).await;
        assert_eq!(o.status, Status::Ok, "{path}: {o:?}");
        assert_eq!(o.stdout, "n  sq\n1  1\n2  4\n", "{path}: {o:?}");
        assert_eq!(o.pictures.len(), 1, "{path}: {o:?}");
        assert_eq!((o.pictures[0].width, o.pictures[0].height), (48, 16));
    }
}
