#!/usr/bin/env node
// Compiles every tool's inputSchema and outputSchema from a tools/list result (a JSON file,
// argument 1) with Ajv in strict mode, draft 2020-12, with the standard formats: the
// validator the official TypeScript SDK uses. A custom format ("uint64"), an unknown
// keyword or an invalid schema is an error. Exit status 1 names every one.
"use strict";
const fs = require("fs");
const path = require("path");
const modules = path.join(__dirname, "..", "npm", "node_modules");
const Ajv2020 = require(path.join(modules, "ajv", "dist", "2020"));
const addFormats = require(path.join(modules, "ajv-formats"));

const tools = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const problems = [];
let compiled = 0;
for (const tool of tools) {
  for (const which of ["inputSchema", "outputSchema"]) {
    const schema = tool[which];
    if (schema === undefined) continue;
    const ajv = new Ajv2020({ strict: true, strictRequired: false, allErrors: true, logger: false });
    addFormats(ajv);
    try {
      ajv.compile(schema);
      compiled += 1;
    } catch (e) {
      problems.push(`${tool.name} ${which}: ${e.message}`);
    }
  }
}
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
console.log(`${compiled} schemas of ${tools.length} tools compile in strict draft 2020-12`);
