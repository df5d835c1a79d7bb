// The JavaScript half of the guest: console, process, timers and error formatting, built on
// native functions that main.rs passes in. main.rs loads it as an ES module (`export default` is
// prepended) and calls the factory once per run before user code; the factory returns the
// hooks main.rs drives the run with.
(function (write, exit, readStdin, argv, env) {
  "use strict";
  const global = globalThis;

  function quote(s) {
    return "'" + s.replace(/\\/g, "\\\\").replace(/'/g, "\\'").replace(/\n/g, "\\n") + "'";
  }

  function isError(v) {
    return v instanceof Error || (v !== null && typeof v === "object" &&
      typeof v.message === "string" && typeof v.stack === "string");
  }

  function formatError(e) {
    let head = String(e.name || "Error");
    if (e.message !== undefined && e.message !== "") head += ": " + e.message;
    const stack = typeof e.stack === "string" ? e.stack : "";
    return stack ? head + "\n" + stack.replace(/\s+$/, "") : head;
  }

  // A small node-like util.inspect: enough to read objects, arrays, maps and errors.
  function inspect(v, depth, seen, nested) {
    switch (typeof v) {
      case "string": return nested ? quote(v) : v;
      case "number": return Object.is(v, -0) ? "-0" : String(v);
      case "bigint": return String(v) + "n";
      case "undefined": return "undefined";
      case "boolean": return String(v);
      case "symbol": return v.toString();
      case "function": {
        const name = v.name ? ": " + v.name : " (anonymous)";
        return (/^class\s/.test(Function.prototype.toString.call(v)) ? "[class" : "[Function") + name + "]";
      }
    }
    if (v === null) return "null";
    if (seen.includes(v)) return "[Circular]";
    if (isError(v)) return formatError(v);
    if (v instanceof Date) return isNaN(v) ? "Invalid Date" : v.toISOString();
    if (v instanceof RegExp) return String(v);
    if (v instanceof Promise) return "Promise { ... }";
    if (depth > 2) return Array.isArray(v) ? "[Array]" : "[Object]";
    seen.push(v);
    try {
      const inner = (x) => inspect(x, depth + 1, seen, true);
      let parts, open, close;
      if (Array.isArray(v) || ArrayBuffer.isView(v)) {
        const n = v.length;
        parts = [];
        for (let i = 0; i < Math.min(n, 100); i++) parts.push(inner(v[i]));
        if (n > 100) parts.push("... " + (n - 100) + " more items");
        const tag = Array.isArray(v) ? "" : v.constructor.name + "(" + n + ") ";
        open = tag + "["; close = "]";
      } else if (v instanceof Map) {
        parts = [...v].map(([k, x]) => inner(k) + " => " + inner(x));
        open = "Map(" + v.size + ") {"; close = "}";
      } else if (v instanceof Set) {
        parts = [...v].map(inner);
        open = "Set(" + v.size + ") {"; close = "}";
      } else {
        parts = Object.keys(v).map((k) =>
          (/^[A-Za-z_$][\w$]*$/.test(k) ? k : quote(k)) + ": " + inner(v[k]));
        const ctor = Object.getPrototypeOf(v);
        const name = ctor === null ? "[Object: null prototype] " :
          ctor.constructor && ctor.constructor !== Object && ctor.constructor.name ?
            ctor.constructor.name + " " : "";
        open = name + "{"; close = "}";
      }
      if (parts.length === 0) return open + close;
      const one = open + " " + parts.join(", ") + " " + close;
      if (one.length <= 72 && !one.includes("\n")) return one;
      const pad = "  ".repeat(depth + 1);
      return open + "\n" + pad + parts.join(",\n" + pad) + "\n" + "  ".repeat(depth) + close;
    } finally {
      seen.pop();
    }
  }

  function format(args) {
    let out = [];
    let i = 0;
    if (typeof args[0] === "string" && args[0].includes("%") && args.length > 1) {
      i = 1;
      out.push(args[0].replace(/%([sdifjoO%])/g, (m, c) => {
        if (c === "%") return "%";
        if (i >= args.length) return m;
        const a = args[i++];
        switch (c) {
          case "s": return typeof a === "string" ? a : inspect(a, 1, [], false);
          case "d": case "i": return String(c === "i" ? parseInt(a) : Number(a));
          case "f": return String(parseFloat(a));
          case "j": try { return JSON.stringify(a); } catch (e) { return "[Circular]"; }
          default: return inspect(a, 0, [], true);
        }
      }));
    }
    for (; i < args.length; i++) out.push(inspect(args[i], 0, [], false));
    return out.join(" ") + "\n";
  }

  const counts = new Map();
  const timersStart = new Map();
  let groupIndent = "";
  const out = (fd) => (...args) => write(fd, groupIndent ? format(args).replace(/^(?=.)/gm, groupIndent) : format(args));
  const console = {
    log: out(1), info: out(1), debug: out(1),
    error: out(2), warn: out(2), trace: out(2),
    dir: (v) => write(1, inspect(v, 0, [], true) + "\n"),
    table: out(1),
    assert: (ok, ...args) => { if (!ok) write(2, "Assertion failed" + (args.length ? ": " + format(args) : "\n")); },
    count: (label = "default") => { const n = (counts.get(label) || 0) + 1; counts.set(label, n); write(1, label + ": " + n + "\n"); },
    countReset: (label = "default") => counts.delete(label),
    time: (label = "default") => timersStart.set(label, Date.now()),
    timeEnd: (label = "default") => { write(1, label + ": " + (Date.now() - (timersStart.get(label) || Date.now())) + "ms\n"); timersStart.delete(label); },
    timeLog: (label = "default") => write(1, label + ": " + (Date.now() - (timersStart.get(label) || Date.now())) + "ms\n"),
    group: (...args) => { if (args.length) write(1, groupIndent + format(args)); groupIndent += "  "; },
    groupEnd: () => { groupIndent = groupIndent.slice(2); },
  };

  // Timers run in virtual time: when no job is left, the earliest timer fires at once. Nothing
  // in the guest ever sleeps, so the host's deadline always stays in charge.
  let timers = [];
  let nextId = 1;
  let now = 0;
  function addTimer(fn, ms, args, repeat) {
    if (typeof fn !== "function") throw new TypeError("the callback must be a function");
    const delay = Math.max(0, Number(ms) || 0);
    const t = { id: nextId++, at: now + delay, delay, fn, args, repeat };
    timers.push(t);
    return t.id;
  }
  function clear(id) { timers = timers.filter((t) => t.id !== id); }

  function runNextTimer() {
    if (timers.length === 0) return false;
    let k = 0;
    for (let j = 1; j < timers.length; j++) {
      if (timers[j].at < timers[k].at || (timers[j].at === timers[k].at && timers[j].id < timers[k].id)) k = j;
    }
    const t = timers[k];
    now = t.at;
    if (t.repeat) t.at = now + Math.max(1, t.delay);
    else timers.splice(k, 1);
    t.fn(...t.args);
    return true;
  }

  function define(name, value) {
    Object.defineProperty(global, name, { value, writable: true, configurable: true, enumerable: false });
  }
  define("console", console);
  define("setTimeout", (fn, ms, ...args) => addTimer(fn, ms, args, false));
  define("setInterval", (fn, ms, ...args) => addTimer(fn, ms, args, true));
  define("setImmediate", (fn, ...args) => addTimer(fn, 0, args, false));
  define("clearTimeout", clear);
  define("clearInterval", clear);
  define("clearImmediate", clear);
  if (typeof global.queueMicrotask !== "function") {
    define("queueMicrotask", (fn) => { Promise.resolve().then(fn); });
  }
  define("scriptArgs", argv.slice(1));
  let stdinText;
  define("readStdin", () => (stdinText === undefined ? (stdinText = readStdin()) : stdinText));
  define("process", {
    argv: argv.slice(),
    env,
    platform: "wasi",
    exitCode: undefined,
    exit(code) {
      const c = code === undefined ? (this.exitCode || 0) : code;
      exit(Number(c) | 0);
    },
    stdout: { write: (s) => { write(1, String(s)); return true; } },
    stderr: { write: (s) => { write(2, String(s)); return true; } },
  });

  return {
    runNextTimer,
    report(e) {
      return "Uncaught " + (isError(e) ? formatError(e) : inspect(e, 0, [], true));
    },
    exitCode() {
      return Number(global.process && global.process.exitCode) | 0;
    },
  };
})
