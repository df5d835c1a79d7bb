// gearbox fork server ("zygote") for Node.js.
//
// Started once per pool key inside a built sandbox root, like python_zygote.py (see there
// for the namespaces, capabilities and the control protocol), with `--single-threaded`:
// V8 then posts no work to its platform's worker threads, which exist in the fork server
// but not in its forks; and with `--no-lazy`: what it loads is compiled here, once. It runs
// no program itself: it loads the native loop of
// /.gearbox/fork.so (launchers/fork/) as a Node-API module and calls `serve`, which forks
// one single-use sandbox per request and never returns in the fork server.
//
// In a program, `serve` returns after the native code has restricted it exactly as the cold
// path restricts a program before exec, rebuilt its event loop's kernel objects (the fork
// server's epoll and eventfd must not be shared) and closed every fd it inherited. The
// program then reads its hand-over on fd 0 and runs as `node main.js` would.
'use strict';
const fs = require('fs');
const Module = require('module');

const CONTROL_FD = 4;
const MAX_HEADER = 16 * 1024 * 1024;

class Fail extends Error {
  constructor(step, message) {
    super(message);
    this.step = step;
  }
}

function send(chan, msg) {
  try {
    fs.writeSync(chan, Buffer.from(JSON.stringify(msg)).subarray(0, 3800));
  } catch {
    // The server went away: nothing to tell.
  }
}

const readStdin = (buf, off, n) => fs.readSync(0, buf, off, n, null);

function readExact(n, read) {
  const buf = Buffer.allocUnsafe(n);
  let off = 0;
  while (off < n) {
    const r = read(buf, off, Math.min(n - off, 1 << 20));
    if (r === 0) throw new Error('hand-over ended early');
    off += r;
  }
  return buf;
}

function readHandover(read = readStdin) {
  const length = readExact(4, read).readUInt32LE(0);
  if (length > MAX_HEADER) throw new Error(`hand-over header of ${length} bytes is too large`);
  const job = JSON.parse(readExact(length, read).toString('utf8'));
  const files = job.files.map(([, size]) => readExact(Number(size), read));
  return [job, files];
}

function writeFile(name, content, root = '/work') {
  // The server validated every name; check again before writing as the sandbox user.
  const parts = name.split('/');
  if (!name || name.startsWith('/') || name.includes('\0') ||
      parts.some((p) => p === '' || p === '.' || p === '..')) {
    throw new Fail('write files', `invalid file name ${JSON.stringify(name)}`);
  }
  let parent = root;
  for (const p of parts.slice(0, -1)) {
    parent += '/' + p;
    try {
      fs.mkdirSync(parent, 0o755);
    } catch (e) {
      if (e.code !== 'EEXIST') throw e;
    }
  }
  const mode = content[0] === 0x23 && content[1] === 0x21 ? 0o755 : 0o644;
  const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
  const fd = fs.openSync(root + '/' + name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, mode);
  try {
    let off = 0;
    while (off < content.length) off += fs.writeSync(fd, content, off);
  } finally {
    fs.closeSync(fd);
  }
}

function program(native, chan, config, source) {
  let job;
  // Before its hand-over: the run's steps rehearsed, so that the pages they write are
  // copied from the fork server and the code they run is mapped now, not on the request's
  // path; stopped between two steps once the hand-over begins to arrive.
  try {
    for (const step of rehearsal(config, source)) {
      if (native.handed()) break;
      step();
    }
  } catch {
    // A step that fails only leaves its warming to the run.
  }
  try {
    // What the steps queued (their streams' write and finish callbacks) runs now, not
    // after the run's own code, where the run would see it and wait for it.
    process._tickCallback();
  } catch {
    // Nothing the steps queue throws; if it did, the rest would run after the program.
  }
  try {
    const [j, files] = readHandover();
    job = j;
    job.files.forEach(([name], i) => writeFile(name, files[i]));
    // The run's own limits, never above the slot's (a run may only lower them).
    const limits = job.limits || {};
    const fsize = Math.min(config.file_size_mb, Number(limits.file_size_mb ?? 1 << 30)) * 1024 * 1024;
    const nofile = Math.min(config.open_files, Number(limits.open_files ?? config.open_files));
    const cpuS = Math.min(config.cpu_s, Number(job.cpu_s || config.cpu_s));
    native.limits(fsize, nofile, cpuS);
  } catch (e) {
    send(chan, e instanceof Fail
      ? { t: 'failed', step: e.step, message: e.message }
      : { t: 'failed', step: 'prepare program', message: String(e) });
    // Not Node's own exit: it would tear down the platform, whose threads a fork lacks.
    native.exit(1);
  }
  send(chan, { t: 'started' });
  fs.closeSync(chan);
  endWithoutTeardown(native);
  run(job);
}

// Node's own end would tear down its platform, whose worker threads exist only in the fork
// server: a program ends through `native.exit` instead, once its `exit` listeners have run
// (or, after an uncaught exception, once Node has printed it: `native.exitCode` keeps the
// code for the native at-exit callback).
function endWithoutTeardown(native) {
  const emit = process.emit;
  let fatal = false;
  process.emit = function (event, ...args) {
    const handled = Reflect.apply(emit, this, [event, ...args]);
    if (event === 'uncaughtException' && !handled) fatal = true;
    if (event === 'exit') {
      const code = Number(process.exitCode ?? args[0] ?? 0) | 0;
      if (fatal) native.exitCode(code);
      else native.exit(code);
    }
    return handled;
  };
  process.reallyExit = (code) => native.exit(Number(code ?? process.exitCode ?? 0) | 0);
}

// Run the program as `node main.js args` would.
function run(job) {
  for (const k of Object.keys(process.env)) delete process.env[k];
  Object.assign(process.env, job.env);
  const argv = job.program_argv;
  process.argv = [process.execPath, '/work/' + argv[0], ...argv.slice(1)];
  // The run's command has no interpreter options (the fork server's stay with it).
  process.execArgv = [];
  // Nor this file among the loaded modules: a cold run's cache holds its program alone.
  delete Module._cache[__filename];
  Module.runMain();
}

// What a run uses that Node loads or compiles on first use, done once in the fork server
// instead of in every fork: the modules behind process.stdout and stderr on a pipe (net,
// stream), the module loader's compile path, and this file's own hand-over path (on a dummy
// job), then each of a run's own steps that leaves nothing behind (V8 creates a function's
// feedback and inline caches on its first calls; made here, every fork shares them): its
// file written (in /tmp, then removed), a module loaded (from the read-only root), its
// messages sent (to /dev/null), its environment set and cleared. Each program rehearses the
// same steps again before its hand-over (`program`).
function warm(config, source) {
  require('net');
  require('tty');
  for (const step of rehearsal(config, source)) step();
  // The callbacks the steps queued run here, compiled and run once, instead of in every
  // program after its own code (a fork inherits the queue: nothing runs it in the fork
  // server, whose script never returns to the event loop).
  process._tickCallback();
}

// A module the rehearsal compiles and loads: it prints nothing. Written into the read-only
// root with this script (`mount.rs`, `NODE_REHEARSED_MODULE`) and loaded from there: the
// module loader caches by path what it finds on its way up from a module (which
// `package.json` governs it, or that none does; real paths), and every path on the way up
// from `/.gearbox` is one no run can change. Loaded from /tmp, it left `/tmp/package.json`
// cached as absent in every program, where a run may create it.
const REHEARSED_MODULE_PATH = '/.gearbox/rehearsed.js';

// The steps of `warm`, each leaving nothing behind: the state a run sees is unchanged.
// `source`: the rehearsed module's, read once by the fork server.
function rehearsal(config, source) {
  let job = null;
  return [
    () => {
      const { Writable } = require('stream');
      const sink = new Writable({ write(chunk, encoding, callback) { callback(); } });
      sink.write('1\n');
      new console.Console(sink, sink).log('%s %d', 'x', 1, { a: [1] });
      sink.end();
    },
    () => {
      const m = new Module('/work/main.js', null);
      m.filename = '/work/main.js';
      m.paths = Module._nodeModulePaths('/work');
      m._compile(source, '/work/main.js');
    },
    () => {
      const header = Buffer.from(JSON.stringify({
        argv: ['node', 'main.js'], files: [['main.js', 15]], program_argv: ['main.js'],
        env: config.run_env, limits: { timeout_ms: 1, open_files: 1, file_size_mb: 1 },
      }));
      const length = Buffer.alloc(4);
      length.writeUInt32LE(header.length, 0);
      const dummy = Buffer.concat([length, header, Buffer.from('console.log(1)\n')]);
      let at = 0;
      const [j, files] = readHandover((buf, off, n) => {
        const k = Math.min(n, dummy.length - at);
        dummy.copy(buf, off, at, at + k);
        at += k;
        return k;
      });
      job = j;
      JSON.stringify({ t: 'started', n: job.files.length + files.length });
    },
    () => {
      // Best effort: a /tmp that refuses the file only leaves that warming to each run.
      let dir = null;
      const name = job.program_argv[0];
      try {
        dir = fs.mkdtempSync('/tmp/gearbox-warm-');
        // Not the dummy job's program: a console here would write to the process's stdout.
        writeFile(name, Buffer.from(source), dir);
      } catch {
        // Nothing warmed; nothing else changes.
      } finally {
        if (dir !== null) {
          // Removed one by one: `rmSync`'s recursive walk costs more than the rest here.
          try {
            fs.unlinkSync(dir + '/' + name);
          } catch {
            // Never written: nothing to remove.
          }
          try {
            fs.rmdirSync(dir);
          } catch {
            // Cannot be: this process made it and emptied it.
          }
        }
      }
    },
    () => {
      try {
        Module._load(REHEARSED_MODULE_PATH, null, false);
      } finally {
        delete Module._cache[REHEARSED_MODULE_PATH];
      }
    },
    () => {
      const devNull = fs.openSync('/dev/null', 'w');
      send(devNull, { t: 'started' });
      fs.closeSync(devNull);
      // The dummy job's: the environment every run of this fork server's key is handed.
      Object.assign(process.env, job.env);
      for (const k of Object.keys(process.env)) delete process.env[k];
    },
  ];
}

function serve() {
  const config = JSON.parse(fs.readFileSync('/.gearbox/zygote.json', 'utf8'));
  const source = fs.readFileSync(REHEARSED_MODULE_PATH, 'utf8');
  const native = { exports: {} };
  process.dlopen(native, '/.gearbox/fork.so');
  native.exports.adopt();
  // A program's environment is its job's alone.
  for (const k of Object.keys(process.env)) delete process.env[k];
  warm(config, source);
  const handed = native.exports.serve(CONTROL_FD, config.disk_mb, config.open_files, config.cpu_s);
  if (handed === null) process.reallyExit(0);
  const [chan, pid, ppid] = handed;
  // Node read these once, in the fork server.
  Object.defineProperty(process, 'pid', { value: pid, enumerable: true, configurable: true });
  Object.defineProperty(process, 'ppid', { value: ppid, writable: true, enumerable: true, configurable: true });
  program(native.exports, chan, config, source);
}

serve();
