// gearbox warm-pool launcher for Node.js. Started inside a fully built sandbox (namespaces,
// seccomp, Landlock, rlimits already applied) before any request exists; it blocks on fd 3
// until the sandbox's init hands over one program, then runs it in this process as
// `node main.js` would, and exits. Used once, never reused.
'use strict';
const fs = require('fs');
const Module = require('module');
const job = JSON.parse(fs.readFileSync(3, 'utf8'));
// The program sees only stdin, stdout and stderr.
fs.closeSync(3);
for (const k of Object.keys(process.env)) delete process.env[k];
Object.assign(process.env, job.env);
process.chdir('/work');
process.argv = [process.argv[0], '/work/' + job.argv[0], ...job.argv.slice(1)];
// Nor this file among the loaded modules: a cold run's cache holds its program alone.
delete Module._cache[__filename];
Module.runMain();
