// gearbox's display hooks for Node: the pictures a program shows come back to the caller as
// images (see gearbox_display.py, which this mirrors).
//
//   const { display } = require('gearbox_display');
//   display(pngBuffer);            // PNG, JPEG or GIF bytes (Buffer, Uint8Array)
//   display('<svg ...>...</svg>'); // SVG text
//   display([{ a: 1 }, { a: 2 }]); // rows: printed as a text table
//
// A picture is at most 256 KiB inline and 1024 px on its long side; there is no image
// library here to downscale a larger one, so it is written to /work/outputs/ and a note says
// so. Each picture leaves on stdout as one line, "\x1egearbox-display " and a JSON object,
// which the server takes out of the output.
'use strict';

const fs = require('fs');

const MAX_SIDE = 1024;
const MAX_BYTES = 256 * 1024;
const MARK = '\x1egearbox-display ';

function sizeOf(b) {
  if (b.length >= 24 && b.slice(0, 8).equals(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]))) {
    return ['image/png', b.readUInt32BE(16), b.readUInt32BE(20), 'png'];
  }
  if (b.length >= 10 && (b.slice(0, 6).toString() === 'GIF87a' || b.slice(0, 6).toString() === 'GIF89a')) {
    return ['image/gif', b.readUInt16LE(6), b.readUInt16LE(8), 'gif'];
  }
  if (b.length >= 4 && b[0] === 0xff && b[1] === 0xd8) {
    let i = 2;
    while (i + 9 < b.length && b[i] === 0xff) {
      const marker = b[i + 1];
      const length = b.readUInt16BE(i + 2);
      if (marker >= 0xc0 && marker <= 0xc2) {
        return ['image/jpeg', b.readUInt16BE(i + 7), b.readUInt16BE(i + 5), 'jpg'];
      }
      i += 2 + length;
    }
    return ['image/jpeg', 0, 0, 'jpg'];
  }
  return null;
}

function keepFull(bytes, ext) {
  try {
    fs.mkdirSync('/work/outputs', { recursive: true });
    let n = 1;
    while (fs.existsSync(`/work/outputs/display-${n}.${ext}`)) n += 1;
    const path = `outputs/display-${n}.${ext}`;
    fs.writeFileSync('/work/' + path, bytes);
    return path;
  } catch (e) {
    return null;
  }
}

function emit(mime, bytes, width, height) {
  const frame = { mime, data: Buffer.from(bytes).toString('base64'), width, height };
  process.stdout.write(MARK + JSON.stringify(frame) + '\n');
}

function table(rows) {
  const shown = rows.slice(0, 30);
  const cols = [];
  for (const r of shown) for (const k of Object.keys(r)) if (!cols.includes(k) && cols.length < 20) cols.push(k);
  const cell = (v) => (v === undefined ? '' : typeof v === 'string' ? v : JSON.stringify(v));
  const widths = cols.map((c) => Math.max(c.length, ...shown.map((r) => cell(r[c]).length)));
  const line = (vals) => vals.map((v, i) => v.padEnd(widths[i])).join('  ').trimEnd();
  const out = [line(cols), ...shown.map((r) => line(cols.map((c) => cell(r[c]))))];
  if (rows.length > shown.length) out.push(`... (${rows.length} rows)`);
  console.log(out.join('\n'));
}

function displayable(v) {
  return (Buffer.isBuffer(v) || v instanceof Uint8Array) && sizeOf(Buffer.from(v)) !== null;
}

function displayOne(v) {
  if (Buffer.isBuffer(v) || v instanceof Uint8Array) {
    const b = Buffer.from(v);
    const s = sizeOf(b);
    if (!s) {
      console.log(b);
      return;
    }
    const [mime, w, h, ext] = s;
    if (Math.max(w, h) <= MAX_SIDE && b.length <= MAX_BYTES) {
      emit(mime, b, w, h);
    } else {
      const full = keepFull(b, ext);
      console.log(`[gearbox: a ${w}x${h} picture is too large to show inline and there is no image library to downscale it${full ? '; kept as ' + full : ''}]`);
    }
  } else if (typeof v === 'string' && /^\s*(<\?xml[^>]*>\s*)?<svg[\s>]/i.test(v)) {
    if (v.length <= MAX_BYTES) {
      emit('image/svg+xml', Buffer.from(v), 0, 0);
    } else {
      const full = keepFull(Buffer.from(v), 'svg');
      console.log(`[gearbox: an SVG of ${v.length} bytes is too large to show inline${full ? '; kept as ' + full : ''}]`);
    }
  } else if (Array.isArray(v) && v.length > 0 && v.every((r) => r && typeof r === 'object' && !Array.isArray(r))) {
    table(v);
  } else {
    console.log(v);
  }
}

function display(...values) {
  for (const v of values) displayOne(v);
}

module.exports = { display, displayable };
