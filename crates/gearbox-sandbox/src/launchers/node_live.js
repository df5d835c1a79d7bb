// gearbox live-session launcher for Node: one interpreter, many cells, in one sandbox.
//
// Started as the program of a sandbox built like any run's. It speaks newline-delimited JSON
// with the server, as launchers/python_live.py does:
//   in  (stdin):  {"cell": N, "code": "...", "timeout_ms": T}
//   out (fd 1):   {"ready": true}, then per cell {"cell": N, "stream": "stdout"|"stderr",
//                 "data": "..."} and one {"cell": N, "done": true, "status": "ok"|"error"|
//                 "interrupted", "result": inspect-or-null, "error": text-or-null}
// Each cell runs as a script in this realm (vm.runInThisContext), so its globals, `var`,
// `let`/`const` and `require`d modules persist; the value of its last expression is the
// result (a promise is awaited). Synchronous code past its timeout is stopped by V8
// (ERR_SCRIPT_EXECUTION_TIMEOUT) and the session goes on; an awaited promise that never
// settles is the server's to end. Output written by a callback counts for the cell that
// scheduled it (AsyncLocalStorage). A child process given this process's own stdio would
// write past the protocol: its lines come back as the running cell's output.
'use strict';

const fs = require('fs');
const vm = require('vm');
const util = require('util');
const Module = require('module');
const { AsyncLocalStorage } = require('async_hooks');

const MAX_RESULT = 64 * 1024;
const cells = new AsyncLocalStorage();
let current = 0;

function send(obj) {
  fs.writeSync(1, JSON.stringify(obj) + '\n');
}

function stream(name) {
  return function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') {
      cb = encoding;
    }
    const data = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    if (data) {
      const cell = cells.getStore() || current;
      send({ cell, stream: name, data });
    }
    if (typeof cb === 'function') {
      process.nextTick(cb);
    }
    return true;
  };
}
process.stdout.write = stream('stdout');
process.stderr.write = stream('stderr');

process.chdir('/work');
globalThis.require = Module.createRequire('/work/');
globalThis.module = { exports: {} };
globalThis.__dirname = '/work';
globalThis.__filename = '/work/<cell>';
let displayable = () => false;
try {
  const hooks = require('gearbox_display');
  globalThis.display = hooks.display;
  displayable = hooks.displayable;
} catch (e) {
  // No display helpers here: cells simply lack display().
}

process.on('uncaughtException', (e) => {
  const cell = cells.getStore() || current;
  send({ cell, stream: 'stderr', data: 'Uncaught ' + (e && e.stack ? e.stack : String(e)) + '\n' });
});
process.on('unhandledRejection', (e) => {
  const cell = cells.getStore() || current;
  send({ cell, stream: 'stderr', data: 'Unhandled rejection: ' + (e && e.stack ? e.stack : String(e)) + '\n' });
});

function inspect(value) {
  let text = util.inspect(value, { depth: 4, maxArrayLength: 100, breakLength: 120 });
  if (text.length > MAX_RESULT) {
    text = text.slice(0, MAX_RESULT) + `... [${text.length} characters]`;
  }
  return text;
}

function cellStack(e) {
  if (!e || !e.stack) {
    return String(e);
  }
  // The cell's frames only: the launcher's are below them.
  return e.stack
    .split('\n')
    .filter((l) => !l.includes('node_live') && !l.includes('/.gearbox/launcher') && !l.includes('node:'))
    .join('\n');
}

async function runCell(msg) {
  const cell = msg.cell;
  current = cell;
  const timeout = Math.max(1, msg.timeout_ms || 30000);
  const started = Date.now();
  let status = 'ok';
  let result = null;
  let error = null;
  try {
    const script = new vm.Script(msg.code, { filename: `<cell ${cell}>` });
    let value = cells.run(cell, () => script.runInThisContext({ timeout, displayErrors: false }));
    if (value && typeof value.then === 'function') {
      const left = Math.max(1, timeout - (Date.now() - started));
      let timer;
      const expired = new Promise((_, reject) => {
        timer = setTimeout(() => reject(Object.assign(new Error('timeout'), { code: 'GEARBOX_TIMEOUT' })), left);
      });
      try {
        value = await Promise.race([value, expired]);
      } finally {
        clearTimeout(timer);
      }
    }
    if (value !== undefined) {
      globalThis._ = value;
      // A picture's bytes are shown, as a notebook shows them.
      if (displayable(value)) {
        cells.run(cell, () => globalThis.display(value));
      } else {
        result = inspect(value);
      }
    }
  } catch (e) {
    if (e && (e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT' || e.code === 'GEARBOX_TIMEOUT')) {
      status = 'interrupted';
      error = `the cell ran past its ${timeout} ms timeout`;
    } else {
      status = 'error';
      send({ cell, stream: 'stderr', data: cellStack(e) + '\n' });
      error = e && e.name ? `${e.name}: ${e.message}` : String(e);
    }
  }
  send({ cell, done: true, status, result, error });
}

// Cells arrive as lines on stdin and run one after another.
let buffered = '';
let queue = Promise.resolve();
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  buffered += chunk;
  let nl;
  while ((nl = buffered.indexOf('\n')) >= 0) {
    const line = buffered.slice(0, nl);
    buffered = buffered.slice(nl + 1);
    if (!line.trim()) {
      continue;
    }
    const msg = JSON.parse(line);
    queue = queue.then(() => runCell(msg));
  }
});
process.stdin.on('end', () => process.exit(0));
send({ ready: true });
