//! Pictures a program shows (`launchers/gearbox_display.py` in the sandbox): each leaves on
//! stdout as one line, `\x1egearbox-display ` and a JSON object; [`extract`] takes them out
//! of the output and checks them. They become MCP `image` contents.
//!
//! A picture is the program's output like any other; what is checked here is that it is
//! what it says (the bytes decode as base64, a PNG's or GIF's size is read from the bytes
//! themselves, not taken from the program), that each is at most [`MAX_PICTURE_BYTES`],
//! and that a run shows at most [`MAX_PICTURES`].

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The start of a picture's line on stdout.
pub const MARK: &str = "\u{1e}gearbox-display ";
/// Most pictures one run shows.
pub const MAX_PICTURES: usize = 16;
/// Most bytes of one picture inline (the display hooks aim at 256 KiB).
pub const MAX_PICTURE_BYTES: usize = 384 * 1024;

/// A picture a run showed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Picture {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/svg+xml`.
    pub mime: String,
    /// Size in pixels (0 for SVG).
    pub width: u32,
    pub height: u32,
    /// Bytes of the picture.
    pub bytes: u64,
    /// The size it had before it was downscaled to fit inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<[u32; 2]>,
    /// Where the full-size picture was written, relative to `/work` (kept when the run is a
    /// session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full: Option<String>,
    /// The picture, base64 (in the MCP `image` content, not repeated in structured output).
    #[serde(skip)]
    #[schemars(skip)]
    pub data: String,
}

#[derive(Deserialize)]
struct Frame {
    mime: String,
    data: String,
    #[serde(default)]
    width: u32,
    #[serde(default)]
    height: u32,
    #[serde(default)]
    original: Option<[u32; 2]>,
    #[serde(default)]
    full: Option<String>,
}

/// The pixel size a PNG or GIF says it has, read from its header.
fn size_of(mime: &str, bytes: &[u8]) -> Option<(u32, u32)> {
    match mime {
        "image/png" if bytes.len() >= 24 && bytes.starts_with(b"\x89PNG\r\n\x1a\n") => Some((
            u32::from_be_bytes(bytes[16..20].try_into().ok()?),
            u32::from_be_bytes(bytes[20..24].try_into().ok()?),
        )),
        "image/gif"
            if bytes.len() >= 10
                && (bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a")) =>
        {
            Some((
                u16::from_le_bytes([bytes[6], bytes[7]]) as u32,
                u16::from_le_bytes([bytes[8], bytes[9]]) as u32,
            ))
        }
        _ => None,
    }
}

/// Check one picture line; `Err` says why it is not shown.
fn picture(json: &str) -> Result<Picture, String> {
    let f: Frame = serde_json::from_str(json).map_err(|e| format!("not a picture ({e})"))?;
    if !["image/png", "image/jpeg", "image/gif", "image/svg+xml"].contains(&f.mime.as_str()) {
        return Err(format!("{:?} is not a picture type shown inline", f.mime));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(f.data.as_bytes())
        .map_err(|e| format!("the picture's data is not base64 ({e})"))?;
    if bytes.len() > MAX_PICTURE_BYTES {
        return Err(format!(
            "a picture of {} bytes is more than {MAX_PICTURE_BYTES}",
            bytes.len()
        ));
    }
    let (width, height) = match f.mime.as_str() {
        "image/png" | "image/gif" => {
            size_of(&f.mime, &bytes).ok_or_else(|| format!("the picture is not a {}", f.mime))?
        }
        "image/jpeg" if bytes.starts_with(&[0xff, 0xd8]) => (f.width, f.height),
        "image/jpeg" => return Err("the picture is not a JPEG".into()),
        _ => {
            let head = String::from_utf8_lossy(&bytes[..bytes.len().min(1024)]).to_lowercase();
            if !head.contains("<svg") {
                return Err("the picture is not an SVG".into());
            }
            (0, 0)
        }
    };
    let full = f
        .full
        .filter(|p| crate::validate_relative_path("full", p).is_ok() && p.starts_with("outputs/"));
    Ok(Picture {
        mime: f.mime,
        width,
        height,
        bytes: bytes.len() as u64,
        original: f.original,
        full,
        data: f.data,
    })
}

/// Take the pictures out of `stdout`: the lines that start with [`MARK`] are removed, and
/// those that check out are returned in order (at most [`MAX_PICTURES`]); a line that does
/// not is replaced by a note saying why.
pub fn extract(stdout: &mut String) -> Vec<Picture> {
    if !stdout.contains(MARK) {
        return Vec::new();
    }
    let mut pictures = Vec::new();
    let mut kept = String::with_capacity(stdout.len());
    for line in stdout.split_inclusive('\n') {
        let Some(json) = line.strip_prefix(MARK) else {
            kept.push_str(line);
            continue;
        };
        if !line.ends_with('\n') {
            kept.push_str("[gearbox: a picture was cut off by the output limit]\n");
            continue;
        }
        if pictures.len() >= MAX_PICTURES {
            continue;
        }
        match picture(json.trim_end()) {
            Ok(p) => pictures.push(p),
            Err(why) => kept.push_str(&format!("[gearbox: a picture is not shown: {why}]\n")),
        }
    }
    *stdout = kept;
    pictures
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32) -> Vec<u8> {
        let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        b.extend(w.to_be_bytes());
        b.extend(h.to_be_bytes());
        b.extend([8, 6, 0, 0, 0]);
        b
    }

    fn line(mime: &str, bytes: &[u8], extra: &str) -> String {
        let data = base64::engine::general_purpose::STANDARD.encode(bytes);
        format!(
            "{MARK}{{\"mime\":\"{mime}\",\"data\":\"{data}\",\"width\":1,\"height\":1{extra}}}\n"
        )
    }

    #[test]
    fn pictures_are_taken_out_and_measured_from_their_bytes() {
        let mut out = format!(
            "before\n{}after\n{}",
            line(
                "image/png",
                &png(640, 480),
                ",\"full\":\"outputs/display-1.png\",\"original\":[2000,1500]"
            ),
            line(
                "image/svg+xml",
                b"<svg xmlns='http://www.w3.org/2000/svg'/>",
                ""
            )
        );
        let p = extract(&mut out);
        assert_eq!(out, "before\nafter\n");
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].width, p[0].height),
            (640, 480),
            "from the PNG, not the program"
        );
        assert_eq!(p[0].original, Some([2000, 1500]));
        assert_eq!(p[0].full.as_deref(), Some("outputs/display-1.png"));
        assert_eq!(p[1].mime, "image/svg+xml");
    }

    #[test]
    fn what_does_not_check_out_is_a_note() {
        let cases = [
            line("text/html", b"<b>x</b>", ""),
            line("image/png", b"not a png at all, really", ""),
            format!("{MARK}{{\"mime\":\"image/png\",\"data\":\"%%%\"}}\n"),
            format!("{MARK}not json\n"),
            line("image/png", &vec![0u8; MAX_PICTURE_BYTES + 1], ""),
        ];
        for case in cases {
            let mut out = case.clone();
            assert!(extract(&mut out).is_empty(), "{case:.80}");
            assert!(out.starts_with("[gearbox: a picture is not shown"), "{out}");
        }
        let mut cut = line("image/png", &png(1, 1), "");
        cut.pop();
        assert!(extract(&mut cut).is_empty());
        assert!(cut.contains("cut off"), "{cut}");
    }

    #[test]
    fn a_full_path_must_stay_in_outputs() {
        for bad in ["../etc/passwd", "/etc/passwd", "work/x.png"] {
            let mut out = line("image/png", &png(2, 2), &format!(",\"full\":\"{bad}\""));
            let p = extract(&mut out);
            assert_eq!(p[0].full, None, "{bad}");
        }
    }

    #[test]
    fn at_most_sixteen_pictures() {
        let mut out: String = (0..20).map(|_| line("image/png", &png(1, 1), "")).collect();
        assert_eq!(extract(&mut out).len(), MAX_PICTURES);
        assert_eq!(out, "");
    }
}
